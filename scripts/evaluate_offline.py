"""Snakemake entry: offline chain acceptance on the held-out split (see eagleflow.evaluate)."""

from eagleflow.evaluate import write_offline
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.sampling import SamplingLimits

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    report = write_offline(
        snakemake.output[0],
        export_dir=snakemake.input.drafter,
        shard_paths=list(snakemake.input.shards),
        target=snakemake.input.model,
        heldout_fraction=snakemake.params.heldout_fraction,
        ks=snakemake.params.ks,
        temperatures=snakemake.params.temperatures,
        draft_sample_method=snakemake.params.draft_sample_method,
        limits=SamplingLimits.of(snakemake.params),
        max_samples=snakemake.params.max_samples,
    )
log.info("%s", report)
