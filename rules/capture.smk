# One pass (extract.capture: during_generation), included instead of generate.smk and
# extract.smk: one job per shard generates the responses and captures the hidden states of the
# prompt and generated tokens as it goes, writing the responses, the shard store and its
# manifest. Sampling knobs and what decides the shard are params: changing one reruns exactly
# these jobs and what depends on them.


rule capture:
    input:
        requests="results/plan/shard-{shard}.jsonl",
        model=target_model_dir,
    output:
        responses="results/responses/shard-{shard}.jsonl",
        hidden=directory(HIDDEN_SHARD),
        manifest=HIDDEN_MANIFEST,
    log:
        "results/logs/capture/shard-{shard}.log",
    benchmark:
        "results/benchmarks/capture/shard-{shard}.tsv"
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
        capture=config["extract"]["capture"],
        aux_layer_ids=aux_layer_ids,
        codec=config["extract"]["codec"],
        chunk_mib=config["extract"]["chunk_mib"],
        max_len=prepare_max_len(),
    script:
        "../scripts/capture.py"
