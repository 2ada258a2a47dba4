"""Snakemake entry: write the held-out demo prompts (see eagleflow.demo.corpus)."""

from eagleflow.demo.corpus import demo_prompts
from eagleflow.files import write_jsonl
from eagleflow.logs import setup_job_logging

log = setup_job_logging(snakemake.log[0])
prompts = demo_prompts(seed=snakemake.params.seed, n=snakemake.params.prompt_count)
write_jsonl(snakemake.output[0], prompts)
log.info("%d held-out demo prompts written", len(prompts))
