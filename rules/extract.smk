# Hidden states of every token of a shard: aux layers + the last layer (pre-norm), one
# compressed, checksummed zarr store per shard, written under a temporary name and renamed, and
# its manifest (sha256 per file: what `python -m eagleflow.repair` compares a new shard with).
# In one pass, rules/capture.smk replaces this file and rules/generate.smk.


rule extract:
    input:
        tokens="results/tokens/shard-{shard}.jsonl",
        model=target_model_dir,
    output:
        hidden=directory(HIDDEN_SHARD),
        manifest=HIDDEN_MANIFEST,
    log:
        "results/logs/extract/shard-{shard}.log",
    benchmark:
        "results/benchmarks/extract/shard-{shard}.tsv"
    conda:
        VLLM_ENV
    threads: 2
    resources:
        mem_mb=6000,
        gpu=engine_gpus("extract"),
    params:
        **engine_params("extract"),
        backend=config["extract"]["backend"],
        aux_layer_ids=aux_layer_ids,
        codec=config["extract"]["codec"],
        chunk_mib=config["extract"]["chunk_mib"],
        max_model_len=config["target"]["max_model_len"],
    script:
        "../scripts/extract.py"
