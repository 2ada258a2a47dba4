# Training samples: the engine's prompt + response ids and the assistant loss mask, per shard.


rule prepare:
    input:
        "results/responses/shard-{shard}.jsonl",
    output:
        "results/tokens/shard-{shard}.jsonl",
    log:
        "results/logs/prepare/shard-{shard}.log",
    benchmark:
        "results/benchmarks/prepare/shard-{shard}.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        max_len=prepare_max_len(),
    script:
        "../scripts/prepare.py"
