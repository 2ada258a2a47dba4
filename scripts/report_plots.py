"""Snakemake entry: the report's plots (see eagleflow.plots)."""

from eagleflow.logs import setup_job_logging
from eagleflow.plots import write_plots

log = setup_job_logging(snakemake.log[0])
write_plots(snakemake.input, snakemake.output, snakemake.params.shard_rule)
log.info("plots: %s", list(snakemake.output))
