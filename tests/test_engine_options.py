"""Engine options (config `engine:`, per stage `generation.engine`, ...) on a finished run: the
speed knobs rerun nothing, the options that change the states rerun exactly their stage and
what follows, and engine jobs ask for tensor x pipeline x data parallel GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import gpus_per_job, run_snakemake, write_config
from faults import planned_shards

from eagleflow.repair import planned_jobs

pytestmark = pytest.mark.slow  # needs the finished demo run


def scheduled_rules(workdir: Path, *args: str) -> dict[str, int]:
    """Jobs per rule of a dry run."""
    counts: dict[str, int] = {}
    for job in planned_jobs(run_snakemake(workdir, "-n", *args).stdout):
        counts[job.rule] = counts.get(job.rule, 0) + 1
    return counts


def test_speed_options_rerun_nothing(demo_copy: Path) -> None:
    """Nor do servers' addresses: servers restarted on other nodes must not rerun hours of
    extraction."""
    urls = {"server_url": ["http://node-7:8001", "http://node-8:8001"]}
    write_config(
        demo_copy,
        {
            "engine": {"max_num_seqs": 8, "gpu_memory_utilization": 0.5, "data_parallel_size": 1},
            "generation": urls,
            "extract": {"engine": {"max_num_batched_tokens": 4096}, **urls},
            "evaluate": {"engine": {"max_num_seqs": 4}, "server_url": "http://node-9:8002"},
        },
    )
    assert scheduled_rules(demo_copy) == {}


def test_state_options_rerun_their_stage_and_what_follows(demo_copy: Path) -> None:
    shards = len(planned_shards(demo_copy))
    # The drafter and its evaluation follow the shards (the vocab follows the tokens only).
    downstream = {"train": 1, "evaluate_offline": 1, "evaluate_serving": 1, "report_plots": 1}
    downstream |= {"all": 1}
    write_config(demo_copy, {"extract": {"engine": {"kv_cache_dtype": "fp8"}}})
    assert scheduled_rules(demo_copy) == {"extract": shards, **downstream}
    write_config(demo_copy, {"evaluate": {"engine": {"extra": {"max_logprobs": 0}}}})
    assert scheduled_rules(demo_copy) == {"evaluate_serving": 1, "report_plots": 1, "all": 1}
    write_config(demo_copy, {"engine": {"dtype": "float32"}})
    jobs = scheduled_rules(demo_copy)
    assert jobs["generate"] == jobs["extract"] == shards
    assert jobs["evaluate_serving"] == 1


@pytest.mark.usefixtures("gpu_machine")
def test_engine_jobs_request_their_engines_gpus(demo_copy: Path) -> None:
    """On an NVIDIA machine: tensor x pipeline parallel GPUs per engine job."""
    write_config(
        demo_copy,
        {
            "engine": {"tensor_parallel_size": 2},
            "extract": {"engine": {"pipeline_parallel_size": 2}},
        },
    )
    gpus = gpus_per_job(run_snakemake(demo_copy, "-n", "--resources", "gpu=8").stdout)
    shards = len(planned_shards(demo_copy))
    assert {rule: jobs for rule, jobs in gpus.items() if jobs} == {
        "generate": [2] * shards,
        "extract": [4] * shards,
        "train": [1],
        "evaluate_serving": [2],
    }
