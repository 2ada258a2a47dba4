"""Snakemake entry: the report's plots (see eagleflow.plots)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.plots import write_plots

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    write_plots(snakemake.input, snakemake.output, snakemake.params.shard_rule)
log.info("plots: %s", list(snakemake.output))
