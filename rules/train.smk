# EAGLE-3 drafter training from all hidden-state shards and the vocab; exports for vLLM/SGLang
# and speculators. Checkpoints live outside the outputs, so a killed job resumes from them.


rule train:
    input:
        shards=all_hidden,
        vocab="results/vocab/vocab.safetensors",
        model=target_model_dir,
    output:
        vllm=directory("results/drafter/vllm"),
        speculators=directory("results/drafter/speculators"),
        metrics="results/drafter/metrics.tsv",
    log:
        "results/logs/train.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        "../envs/torch.yaml"
    threads: workflow.cores
    resources:
        mem_mb=8000,
        gpu=TRAIN_GPUS,
    params:
        settings=train_settings,
        checkpoint_dir="results/checkpoints/drafter",
    script:
        "../scripts/train.py"
