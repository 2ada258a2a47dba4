# EAGLE-3 drafter workflow: prompts -> target responses -> hidden states -> drafter -> acceptance.
# Stages live in rules/<stage>.smk; their logic in the `eagleflow` package.


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/demo.smk"
include: "rules/prompts.smk"
include: "rules/plan.smk"


if ONE_PASS:

    include: "rules/capture.smk"

else:

    include: "rules/generate.smk"
    include: "rules/extract.smk"


include: "rules/prepare.smk"
include: "rules/vocab.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"


rule all:
    default_target: True
    input:
        "results/drafter/vllm",
        "results/drafter/speculators",
        "results/eval/serving.json",
        rules.report_plots.output,


# Stop after a stage: `snakemake --cores all responses`.
rule responses:
    input:
        all_responses,


rule hidden:
    input:
        all_hidden,


rule drafter:
    input:
        "results/drafter/vllm",


rule evaluation:
    input:
        "results/eval/offline.json",
        "results/eval/serving.json",
