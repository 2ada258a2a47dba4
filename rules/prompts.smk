# Prompt files (OpenAI messages, ShareGPT conversations, plain prompt) -> one normalized JSONL.


rule normalize_prompts:
    input:
        prompt_files,
    output:
        prompts="results/prompts/prompts.jsonl",
        stats="results/prompts/stats.json",
    log:
        "results/logs/normalize_prompts.log",
    benchmark:
        "results/benchmarks/normalize_prompts.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        on_error=config["prompts"]["on_error"],
        limit=config["prompts"]["limit"],
    script:
        "../scripts/normalize_prompts.py"
