"""How long `snakemake -n` takes to plan the whole workflow as the shard count grows.

For each shard count N, a temporary working directory is set up as if the run had just passed
the `plan` checkpoint: a fake target directory (only config.json: the DAG reads the layer count
from it), a prompt file, normalized prompts and a real plan written by `eagleflow.plan.write_plan`
with N shards, each output newer than its inputs. `snakemake -n` of the default target `all`
then expands generate / prepare / extract / token_counts over the N shards, and the fan-in jobs
(vocab, train, evaluation, report) over all of them. Prints a markdown table: shards, jobs
planned, seconds (wall time of the whole `snakemake -n` process, startup included).

Goal: 1,000 shards planned in <= 15 s.

    .venv/bin/python bench/dag_scale.py --shards 100,1000,5000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eagleflow.files import write_jsonl
from eagleflow.plan import write_plan

REPO = Path(__file__).resolve().parents[1]
GOAL_SHARDS, GOAL_SECONDS = 1000, 15.0
SAMPLES_PER_SHARD = 2
# A fake target of 8 layers: the default aux ids (2, 4, 5) resolve at DAG time from its depth.
FAKE_TARGET_CONFIG = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 128}


def planned_workdir(root: Path, shards: int) -> Path:
    """A working directory in the state right after the plan checkpoint, with `shards` shards."""
    workdir = root / f"shards-{shards}"
    model = workdir / "target"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(FAKE_TARGET_CONFIG))
    samples = shards * SAMPLES_PER_SHARD
    prompts = [
        {"id": f"p{i:07d}", "messages": [{"role": "user", "content": f"question {i}"}]}
        for i in range(samples)
    ]
    write_jsonl(workdir / "prompts.jsonl", prompts)
    config = {
        "target": {"model": str(model)},
        "prompts": {"paths": [str(workdir / "prompts.jsonl")]},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # Outputs of normalize_prompts, then of the plan: each written after its inputs (mtime order).
    write_jsonl(workdir / "results/prompts/prompts.jsonl", prompts)
    (workdir / "results/prompts/stats.json").write_text(json.dumps({"prompts": samples}))
    time.sleep(0.01)
    requests = [{**p, "prompt_id": p["id"]} for p in prompts]
    summary = write_plan(
        workdir / "results/plan",
        requests,
        [[1, 2, 3]] * samples,
        expected_response_tokens=10,
        shard_tokens=10**9,
        max_samples=SAMPLES_PER_SHARD,
    )
    assert len(summary["shards"]) == shards
    return workdir


def dry_run(workdir: Path) -> tuple[int, float]:
    """(jobs planned, seconds) of `snakemake -n` for the default target in `workdir`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "2", "-n",
    ]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    totals = re.findall(r"^total\s+(\d+)\s*$", output, flags=re.MULTILINE)
    if result.returncode != 0 or not totals:
        sys.exit(f"snakemake -n failed in {workdir} (exit {result.returncode}):\n{output[-4000:]}")
    return int(totals[-1]), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shards", default="100,1000,5000", help="comma-separated shard counts to plan"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.shards.split(",")]

    print(f"goal: {GOAL_SHARDS:,} shards planned by `snakemake -n` in <= {GOAL_SECONDS:.0f} s\n")
    print("| shards | jobs planned | seconds |")
    print("|---:|---:|---:|")
    goal_seconds = None
    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        for shards in counts:
            jobs, seconds = dry_run(planned_workdir(Path(tmp), shards))
            print(f"| {shards:,} | {jobs:,} | {seconds:.1f} |", flush=True)
            if shards == GOAL_SHARDS:
                goal_seconds = seconds
    if goal_seconds is not None:
        verdict = "met" if goal_seconds <= GOAL_SECONDS else "NOT met"
        print(f"\ngoal {verdict}: {goal_seconds:.1f} s for {GOAL_SHARDS:,} shards")


if __name__ == "__main__":
    main()
