"""Snakemake entry: train and export the drafter (see eagleflow.train)."""

from eagleflow.logs import log_job_errors, setup_job_logging
from eagleflow.train import TrainSettings, run_training

if __name__ == "__main__":  # loader workers and torchrun re-import modules
    log = setup_job_logging(snakemake.log[0])
    settings = TrainSettings(
        **snakemake.params.settings,
        shards=list(snakemake.input.shards),
        vocab=snakemake.input.vocab,
        target=snakemake.input.model,
        out_vllm=snakemake.output.vllm,
        out_speculators=snakemake.output.speculators,
        metrics=snakemake.output.metrics,
        checkpoint_dir=snakemake.params.checkpoint_dir,
        threads=snakemake.threads,
        num_workers=snakemake.config["train"]["num_workers"],
    )
    with log_job_errors(log):
        run_training(settings, nproc=snakemake.config["train"]["nproc"], log_path=snakemake.log[0])
