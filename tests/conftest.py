"""Shared test helpers: run the real workflow with Snakemake in temporary working directories."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIG = REPO / "tests" / "config.test.yaml"


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
    cmd = [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "2",
        *args,
    ]  # fmt: skip
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
    workdir = tmp_path_factory.mktemp("demo_run")
    write_config(workdir)
    run_snakemake(workdir)
    return workdir
