"""The workflow through the SLURM profile (profiles/slurm) on light rules only.

Needs a reachable SLURM cluster (`sinfo`), e.g. the single-node one that
scripts/slurm/setup_local_slurm.sh sets up; skipped otherwise.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_snakemake, write_config


def _slurm_unavailable() -> str | None:
    """Why SLURM cannot be used here, or None when `sinfo` answers."""
    if shutil.which("sinfo") is None:
        return "SLURM not available: no `sinfo` (run scripts/slurm/setup_local_slurm.sh)"
    try:
        probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "SLURM not available: `sinfo` timed out"
    if probe.returncode != 0:
        return f"SLURM not available: `sinfo` failed: {probe.stderr.strip()[:200]}"
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout
    if not {"idle", "mixed", "allocated"} & set(states.split()):
        return f"SLURM has no node that can run jobs (node states: {' '.join(states.split())})"
    return None


UNAVAILABLE = _slurm_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")

PROFILE = REPO / "profiles" / "slurm"
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+)")


def _sacct_works() -> bool:
    return subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode == 0


def _profile_args() -> list[str]:
    """The SLURM profile alone (not profiles/default: `gpu=0` would cap GPU requests), plus what
    a cluster without an accounting database needs (setup_local_slurm.sh's has none)."""
    args = ["--profile", str(PROFILE), "--workflow-profile", "none"]
    args += ["--slurm-init-seconds-before-status-checks", "2"]
    if not _sacct_works():
        args += ["--slurm-status-command", "squeue", "--slurm-no-account"]
    return args


def _job_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM's own record of the jobs: sacct where accounting works, else squeue (MinJobAge)."""
    ids = ",".join(job_ids)
    if _sacct_works():
        cmd = ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ids]
    else:
        cmd = ["squeue", "--states=all", "-h", "-o", "%i|%T", "-j", ids]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return dict(line.split("|", 1) for line in out.split())


def test_light_rules_run_as_slurm_jobs(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "What is 17 + 25?"}\n'
        '{"messages": [{"role": "user", "content": "Sort: 9 3 7"}]}\n'
        '{"conversations": [{"from": "human", "value": "Reverse abc"}]}\n'
        '{"prompt": "What is 17 + 25?"}\n'
    )
    write_config(tmp_path, {"prompts": {"paths": [str(prompts)]}})
    # Light rules only: prompt normalization and the demo prompts. `plan` is left out: it reads
    # the target's tokenizer, i.e. it would build the demo target (minutes of training).
    targets = ["results/prompts/prompts.jsonl", "results/demo/prompts.jsonl"]

    first = run_snakemake(tmp_path, *_profile_args(), *targets, timeout=900)
    output = first.stdout + first.stderr
    job_ids = SUBMITTED.findall(output)
    print(f"\nSLURM jobs submitted: {len(job_ids)} (ids {', '.join(job_ids)})")
    assert len(job_ids) == 2, output[-3000:]
    states = _job_states(job_ids)
    print(f"SLURM job states: {states}")
    assert sorted(states) == sorted(job_ids)
    assert set(states.values()) == {"COMPLETED"}, states

    stats = (tmp_path / "results/prompts/stats.json").read_text()
    assert '"kept": 3' in stats and '"duplicates": 1' in stats
    assert (tmp_path / "results/prompts/prompts.jsonl").stat().st_size > 0
    assert (tmp_path / "results/demo/prompts.jsonl").stat().st_size > 0
    # Each rule's job log from SLURM (the profile keeps them).
    for rule in ("normalize_prompts", "demo_prompts"):
        assert list((tmp_path / ".snakemake/slurm_logs" / f"rule_{rule}").glob("*.log")), rule

    second = run_snakemake(tmp_path, *_profile_args(), *targets, timeout=300)
    again = second.stdout + second.stderr
    assert "Nothing to be done" in again, again[-3000:]
    assert not SUBMITTED.findall(again)
