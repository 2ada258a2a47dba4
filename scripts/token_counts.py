"""Snakemake entry: loss-masked token counts of one shard (see eagleflow.vocab)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.target_config import target_vocab_size
from eagleflow.vocab import count_tokens, write_counts

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    counts = count_tokens(
        snakemake.input.tokens,
        target_vocab_size(snakemake.input.model),
        snakemake.params.heldout_fraction,
    )
    write_counts(snakemake.output[0], counts)
log.info("loss tokens: %s", {split: int(c.sum()) for split, c in counts.items()})
