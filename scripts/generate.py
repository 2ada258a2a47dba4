"""Snakemake entry: the target answers one shard's requests (see eagleflow.generate), and in one
pass also captures the shard's hidden states (see eagleflow.capture)."""

from eagleflow.capture import ShardFormat, generate_and_capture_shard
from eagleflow.generate import Sampling, generate_shard
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.status import disk_preflight

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    log = setup_job_logging(snakemake.log[0])
    params, output = snakemake.params, snakemake.output
    generation = snakemake.config["generation"]
    sampling = Sampling(params.temperature, params.top_p, params.max_new_tokens, params.seed)
    with log_job_errors(log):
        if "hidden" in output.keys():
            disk_preflight(snakemake.config, "results", log)
            summary = generate_and_capture_shard(
                snakemake.input.requests,
                snakemake.input.model,
                output.responses,
                output.hidden,
                backend=params.backend,
                sampling=sampling,
                on_truncated=params.on_truncated,
                max_model_len=params.max_model_len,
                shard_format=ShardFormat(
                    params.aux_layer_ids,
                    params.codec,
                    int(params.chunk_mib * 2**20),
                    params.max_len,
                ),
                server_url=generation["server_url"],
                server_concurrency=generation["server_concurrency"],
            )
        else:
            summary = generate_shard(
                snakemake.input.requests,
                snakemake.input.model,
                output.responses,
                backend=params.backend,
                sampling=sampling,
                on_truncated=params.on_truncated,
                max_model_len=params.max_model_len,
                server_url=generation["server_url"],
                server_concurrency=generation["server_concurrency"],
            )
    log.info("%s", summary)
