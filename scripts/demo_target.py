"""Snakemake entry: the deterministic demo target, shipped or built (see eagleflow.demo.shipped)."""

from eagleflow.demo.shipped import provide_demo_target
from eagleflow.logs import log_job_errors, setup_job_logging

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    summary = provide_demo_target(snakemake.output[0], **snakemake.params.settings)
log.info("demo target: %s", summary)
