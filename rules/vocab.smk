# Draft vocabulary: loss-masked token counts per shard, then d2t / t2d and its coverage report.


rule token_counts:
    input:
        tokens="results/tokens/shard-{shard}.jsonl",
        model=target_model_dir,
    output:
        "results/token_counts/shard-{shard}.npz",
    log:
        "results/logs/token_counts/shard-{shard}.log",
    benchmark:
        "results/benchmarks/token_counts/shard-{shard}.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        heldout_fraction=config["train"]["heldout_fraction"],
    script:
        "../scripts/token_counts.py"


rule vocab:
    input:
        counts=all_token_counts,
        model=target_model_dir,
    output:
        vocab="results/vocab/vocab.safetensors",
        report="results/vocab/coverage.json",
    log:
        "results/logs/vocab.log",
    benchmark:
        "results/benchmarks/vocab.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        reuse=config["vocab"]["reuse"],
    script:
        "../scripts/vocab.py"
