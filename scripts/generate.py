"""Snakemake entry: the target answers one shard's requests (see eagleflow.generate)."""

from eagleflow.engine import engine_options
from eagleflow.generate import Sampling, generate_shard
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.server_client import server_urls, servers_for_shard

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    log = setup_job_logging(snakemake.log[0])
    params, generation = snakemake.params, snakemake.config["generation"]
    sampling = Sampling.from_params(params)
    with log_job_errors(log):
        summary = generate_shard(
            snakemake.input.requests,
            snakemake.input.model,
            snakemake.output.responses,
            backend=params.backend,
            sampling=sampling,
            on_truncated=params.on_truncated,
            max_model_len=params.max_model_len,
            server_url=servers_for_shard(
                server_urls(generation["server_url"]), snakemake.wildcards.shard
            ),
            server_concurrency=generation["server_concurrency"],
            engine_options=engine_options(snakemake.config, "generation"),
        )
    log.info("%s", summary)
