# The built-in demo target and its held-out prompts: deterministic, offline, built on demand.


rule demo_target:
    output:
        directory(DEMO_TARGET),
    log:
        "results/logs/demo_target.log",
    benchmark:
        "results/benchmarks/demo_target.tsv"
    conda:
        "../envs/torch.yaml"
    threads: 2
    resources:
        mem_mb=4000,
    params:
        settings=config_section("demo_target"),
    script:
        "../scripts/demo_target.py"


# No corpus knob in params: the held-out split is a hash of the prompt text.
rule demo_prompts:
    output:
        DEMO_PROMPTS,
    log:
        "results/logs/demo_prompts.log",
    benchmark:
        "results/benchmarks/demo_prompts.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        seed=config["demo_prompts"]["seed"],
        prompt_count=config["demo_prompts"]["count"],
    script:
        "../scripts/demo_prompts.py"
