"""Snakemake entry: write the held-out demo prompts (see eagleflow.demo.corpus)."""

from eagleflow.demo.corpus import demo_prompts
from eagleflow.files import write_jsonl
from eagleflow.logs import log_job_errors, setup_job_logging

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    prompts = demo_prompts(seed=snakemake.params.seed, n=snakemake.params.prompt_count)
    write_jsonl(snakemake.output[0], prompts)
log.info("%d held-out demo prompts written", len(prompts))
