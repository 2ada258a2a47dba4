"""Snakemake entry: training samples of one shard (see eagleflow.prepare)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.prepare import prepare_shard

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    summary = prepare_shard(
        snakemake.input[0], snakemake.output[0], max_len=snakemake.params.max_len
    )
log.info("%s", summary)
