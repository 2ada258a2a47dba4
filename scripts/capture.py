"""Snakemake entry: in one pass, the target answers one shard's requests and its hidden states
are captured as it generates (see eagleflow.capture)."""

from eagleflow.capture import ShardFormat, generate_and_capture_shard
from eagleflow.engine import engine_options
from eagleflow.generate import Sampling
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.server_client import server_urls, servers_for_shard
from eagleflow.status import disk_preflight

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    log = setup_job_logging(snakemake.log[0])
    params, output = snakemake.params, snakemake.output
    generation = snakemake.config["generation"]
    sampling = Sampling.from_params(params)
    with log_job_errors(log):
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
            server_url=servers_for_shard(
                server_urls(generation["server_url"]), snakemake.wildcards.shard
            ),
            server_concurrency=generation["server_concurrency"],
            engine_options=engine_options(snakemake.config, "generation"),
        )
    log.info("%s", summary)
