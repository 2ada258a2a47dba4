"""Shared test helpers: run the real workflow with Snakemake in temporary working directories."""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from faults import (  # scheduled_outputs: re-exported for the tests
    scheduled_outputs,  # noqa: F401
    snakemake_command,
)

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIG = REPO / "tests" / "config.test.yaml"

# Outputs of training and of everything downstream of it (evaluation, the report's plots).
TRAINING_AND_DOWNSTREAM = [
    "results/drafter/metrics.tsv", "results/drafter/speculators", "results/drafter/vllm",
    "results/eval/offline.json", "results/eval/serving.json",
    "results/report/acceptance.png", "results/report/shards.png",
    "results/report/training.png", "results/report/vocab.png",
]  # fmt: skip


@pytest.fixture
def gpu_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `nvidia-smi` on PATH: the workflow plans as on an NVIDIA machine (GPU
    requests per job), though no GPU is here."""
    stub = tmp_path / "gpu-machine" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\necho 'a stand-in: no GPU here'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")


def gpus_per_job(dry_run_stdout: str) -> dict[str, list[int]]:
    """The GPUs each job of a `snakemake -n` listing requests, by rule ([] when none does)."""
    gpus: dict[str, list[int]] = {}
    rule = ""
    for line in dry_run_stdout.splitlines():
        if line.startswith(("rule ", "checkpoint ", "localrule ")):
            rule = line.split()[1].rstrip(":")
            gpus.setdefault(rule, [])
        elif match := re.search(r"resources: .*\bgpu=(\d+)", line):
            gpus[rule].append(int(match.group(1)))
    return gpus


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deep_merge(base: dict, override: dict) -> dict:
    """`base` with `override` applied key by key (nested dicts merged, other values replaced)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_config(workdir: Path, overrides: dict | None = None) -> Path:
    """Write workdir/config.yaml: the test config with `overrides` merged in."""
    config = deep_merge(yaml.safe_load(TEST_CONFIG.read_text()), overrides or {})
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: float = 1800
) -> subprocess.CompletedProcess:
    """Run the repo's Snakefile in `workdir` (which holds config.yaml) and return the result.

    Output is captured; on an unexpected exit status the tail of it is shown in the failure.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = snakemake_command(workdir, *args)
    result = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        tail = (result.stdout + result.stderr)[-6000:]
        pytest.fail(f"snakemake {' '.join(args)} exited {result.returncode}:\n{tail}")
    return result


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the whole workflow ran once on the test config.

    Builds the real demo target (a few minutes), so every test that needs a trained target
    shares this one build.
    """
    if os.environ.get("EAGLEFLOW_DEMO_RUN"):  # reuse a finished run while developing tests
        return Path(os.environ["EAGLEFLOW_DEMO_RUN"])
    workdir = tmp_path_factory.mktemp("demo_run")
    write_config(workdir)
    run_snakemake(workdir)
    return workdir


@pytest.fixture
def demo_copy(demo_run: Path, tmp_path: Path) -> Path:
    """A private copy of the finished demo run (mtimes and Snakemake metadata kept)."""
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy, symlinks=True)
    return copy
