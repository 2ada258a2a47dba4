"""Snakemake entry: served acceptance and the serving check (see eagleflow.serving_check)."""

import json
from pathlib import Path

from eagleflow.engine import engine_options
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.sampling import SamplingLimits
from eagleflow.serving_check import serving_check

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    log = setup_job_logging(snakemake.log[0])
    params = snakemake.params
    evaluate = snakemake.config["evaluate"]
    with log_job_errors(log):
        report = serving_check(
            snakemake.output[0],
            offline=json.loads(Path(snakemake.input.offline).read_text()),
            export_dir=snakemake.input.drafter,
            shard_paths=list(snakemake.input.shards),
            target=snakemake.input.model,
            heldout_fraction=params.heldout_fraction,
            k=params.k,
            other_ks=params.other_ks,
            temperatures=params.temperatures,
            draft_sample_method=params.draft_sample_method,
            limits=SamplingLimits.of(params),
            data_temperature=params.data_temperature,
            # not params: a change to them reruns generation, and so this job, anyway
            data_limits=SamplingLimits.of(snakemake.config["generation"]),
            tolerance=params.tolerance,
            max_prompts=params.max_prompts,
            # [speed]: read from the config, not params, so changing them reruns nothing
            compare_plain=evaluate["compare_plain"],
            server_url=evaluate["server_url"] if evaluate["backend"] == "server" else None,
            max_tokens=params.max_tokens,
            max_model_len=params.max_model_len,
            engine_options=engine_options(snakemake.config, "evaluate"),
        )
    for warning in report["warnings"]:
        log.warning("%s", warning)
    log.info("%s", report)
