"""Snakemake entry: the draft vocab map and its coverage report (see eagleflow.vocab)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.vocab import build_vocab

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    report = build_vocab(
        snakemake.input.counts,
        snakemake.input.model,
        snakemake.output.vocab,
        snakemake.output.report,
        draft_vocab_size=snakemake.params.draft_vocab_size,
        reuse=snakemake.params.reuse,
    )
log.info("%s", report)
