"""Snakemake entry: build the deterministic demo target (see eagleflow.demo.target)."""

from eagleflow.demo.target import build_demo_target
from eagleflow.logs import setup_job_logging

log = setup_job_logging(snakemake.log[0])
summary = build_demo_target(snakemake.output[0], **snakemake.params.settings)
log.info("demo target built: %s", summary)
