# Acceptance of the exported drafter: offline chain simulation on held-out shards, then served
# in vLLM; the serving rule fails (with diagnostics) when served acceptance falls short.


rule evaluate_offline:
    input:
        drafter="results/drafter/vllm",
        shards=all_hidden,
        model=target_model_dir,
    output:
        "results/eval/offline.json",
    log:
        "results/logs/evaluate_offline.log",
    benchmark:
        "results/benchmarks/evaluate_offline.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        mem_mb=8000,
    params:
        **sampling_limits("evaluate"),
        ks=config["evaluate"]["ks"],
        temperatures=config["evaluate"]["temperatures"],
        draft_sample_method=config["evaluate"]["draft_sample_method"],
        max_samples=config["evaluate"]["max_samples"],
        heldout_fraction=config["train"]["heldout_fraction"],
    script:
        "../scripts/evaluate_offline.py"


rule evaluate_serving:
    input:
        offline="results/eval/offline.json",
        drafter="results/drafter/vllm",
        shards=all_hidden,
        model=target_model_dir,
    output:
        "results/eval/serving.json",
    log:
        "results/logs/evaluate_serving.log",
    benchmark:
        "results/benchmarks/evaluate_serving.tsv"
    conda:
        VLLM_ENV
    threads: 2
    resources:
        mem_mb=6000,
        gpu=engine_gpus("evaluate"),
    params:
        **engine_params("evaluate"),
        **sampling_limits("evaluate"),
        k=config["evaluate"]["serving_k"],
        other_ks=config["evaluate"]["other_served_ks"],
        temperatures=config["evaluate"]["temperatures"],
        draft_sample_method=config["evaluate"]["draft_sample_method"],
        data_temperature=config["generation"]["temperature"],
        max_prompts=config["evaluate"]["max_prompts"],
        tolerance=config["evaluate"]["tolerance"],
        heldout_fraction=config["train"]["heldout_fraction"],
        max_tokens=config["generation"]["max_new_tokens"],
        max_model_len=config["target"]["max_model_len"],
    script:
        "../scripts/evaluate_serving.py"


rule report_plots:
    input:
        metrics="results/drafter/metrics.tsv",
        serving="results/eval/serving.json",
        coverage="results/vocab/coverage.json",
        shards=all_hidden,
    output:
        training=report("results/report/training.png", category="Training"),
        acceptance=report("results/report/acceptance.png", category="Acceptance"),
        shards=report("results/report/shards.png", category="Hidden states"),
        vocab=report("results/report/vocab.png", category="Vocab"),
    log:
        "results/logs/report_plots.log",
    benchmark:
        "results/benchmarks/report_plots.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        shard_rule=SHARD_RULE,
    script:
        "../scripts/report_plots.py"
