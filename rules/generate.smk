# Target responses, one job per shard. Sampling knobs are params: changing one reruns exactly
# the generation jobs and what depends on them. In one pass (extract.capture:
# during_generation), rules/capture.smk replaces this file and rules/extract.smk.


rule generate:
    input:
        requests="results/plan/shard-{shard}.jsonl",
        model=target_model_dir,
    output:
        responses="results/responses/shard-{shard}.jsonl",
    log:
        "results/logs/generate/shard-{shard}.log",
    benchmark:
        "results/benchmarks/generate/shard-{shard}.tsv"
    conda:
        VLLM_ENV
    threads: 2
    resources:
        mem_mb=6000,
        gpu=engine_gpus("generation"),
    params:
        **engine_params("generation"),
        **sampling_limits("generation", ["top_k"]),
        backend=config["generation"]["backend"],
        temperature=config["generation"]["temperature"],
        top_p=config["generation"]["top_p"],
        max_new_tokens=config["generation"]["max_new_tokens"],
        seed=config["generation"]["seed"],
        on_truncated=config["generation"]["on_truncated"],
        max_model_len=config["target"]["max_model_len"],
    script:
        "../scripts/generate.py"
