"""Snakemake entry: extract one shard's hidden states (see eagleflow.extract)."""

from eagleflow.engine import engine_options
from eagleflow.extract import extract_shard
from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.server_client import server_urls, servers_for_shard
from eagleflow.status import disk_preflight

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    log = setup_job_logging(snakemake.log[0])
    params, extract = snakemake.params, snakemake.config["extract"]
    with log_job_errors(log):
        disk_preflight(snakemake.config, "results", log)
        summary = extract_shard(
            snakemake.input.tokens,
            snakemake.input.model,
            snakemake.output.hidden,
            backend=params.backend,
            layer_ids=params.aux_layer_ids,
            codec=params.codec,
            chunk_bytes=int(params.chunk_mib * 2**20),
            max_model_len=params.max_model_len,
            batch_tokens=extract["batch_tokens"],
            server_url=servers_for_shard(
                server_urls(extract["server_url"]), snakemake.wildcards.shard
            ),
            server_concurrency=extract["server_concurrency"],
            encode_threads=snakemake.threads,
            engine_options=engine_options(snakemake.config, "extract"),
        )
    log.info("%s", summary)
