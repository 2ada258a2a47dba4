"""Snakemake entry: split the normalized prompts into token-sized shards (see eagleflow.plan)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.plan import plan_from_prompts

log = setup_job_logging(snakemake.log[0])
with log_job_errors(log):
    summary = plan_from_prompts(
        snakemake.input.prompts,
        snakemake.input.model,
        snakemake.output[0],
        turns=snakemake.params.turns,
        max_model_len=snakemake.params.max_model_len,
        on_error=snakemake.params.on_error,
        trust_remote_code=snakemake.config["target"]["trust_remote_code"],
        chat_template_kwargs=snakemake.config["target"]["chat_template_kwargs"],
        **snakemake.params.settings,
    )
log.info(
    "%d samples in %d shards, %d estimated tokens; %d skipped",
    summary["samples"],
    len(summary["shards"]),
    summary["estimated_tokens"],
    len(summary.get("skipped", [])),
)
