"""Snakemake entry: offline chain acceptance on the held-out split (see eagleflow.evaluate)."""

from eagleflow.evaluate import write_offline
from eagleflow.logs import log_job_errors, setup_job_logging

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
        top_k=snakemake.params.get("top_k", 0),
        top_p=snakemake.params.get("top_p", 1.0),
        max_samples=snakemake.params.max_samples,
    )
log.info("%s", report)
