"""Snakemake entry: normalize prompt files (see eagleflow.prompts)."""

from eagleflow.files import write_json, write_jsonl
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.prompts import normalize_prompts

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    records, stats = normalize_prompts(
        list(snakemake.input), on_error=snakemake.params.on_error, limit=snakemake.params.limit
    )
    write_jsonl(snakemake.output.prompts, records)
    write_json(snakemake.output.stats, stats.as_dict())
log.info(
    "%d prompts kept from %d lines: %d duplicates dropped, %d bad lines skipped",
    stats.kept,
    stats.lines,
    stats.duplicates,
    stats.skipped,
)
for example in stats.skipped_examples:
    log.warning("skipped %s", example)
