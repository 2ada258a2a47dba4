# The shard plan (a checkpoint: the shard count is known only once the prompts are read).


checkpoint plan:
    input:
        prompts="results/prompts/prompts.jsonl",
        model=target_model_dir,
    output:
        directory("results/plan"),
    log:
        "results/logs/plan.log",
    benchmark:
        "results/benchmarks/plan.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        mem_mb=4000,
    params:
        **chat_template_params(),
        turns=config["generation"]["turns"],
        max_model_len=config["target"]["max_model_len"],
        on_error=config["prompts"]["on_error"],
        settings=config_section("plan"),
    script:
        "../scripts/plan.py"
