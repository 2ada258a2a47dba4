"""How long `snakemake -n` takes to plan the whole workflow as the shard count grows.

For each shard count N, a temporary working directory is set up as if the run had just passed
the `plan` checkpoint: a fake target directory (config.json, whose layer count the DAG reads,
and a placeholder tokenizer.json, which config validation wants to exist), a prompt file,
normalized prompts and a real plan written by `eagleflow.plan.write_plan` with N shards, each
output newer than its inputs. `snakemake -n` of the default target `all` then expands generate /
prepare / extract / token_counts over the N shards, and the fan-in jobs (vocab, train,
evaluation, report) over all of them. Prints a markdown table: shards, jobs planned, seconds
(wall time of the whole `snakemake -n` process, startup included).

Goal: 1,000 shards planned in <= 15 s.

With `--noop-workdir DIR` (a finished workflow directory: its config.yaml and results/), it also
times `snakemake --cores all` there, a run with nothing to do (wall time, startup included);
goal: 0 jobs in <= 5 s. A dry run comes first: where jobs are left, they are reported, not run.

    .venv/bin/python bench/dag_scale.py --shards 100,1000,5000 [--noop-workdir .]
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
from rows import REPO, Row, finish, output_arguments

from eagleflow.files import write_jsonl
from eagleflow.plan import write_plan

GOAL_SHARDS, GOAL_SECONDS = 1000, 15.0
GOAL_NOOP_SECONDS = 5.0
SAMPLES_PER_SHARD = 2
# A fake target of 8 layers: the default aux ids (2, 4, 5) resolve at DAG time from its depth.
FAKE_TARGET_CONFIG = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 128}


def planned_workdir(root: Path, shards: int) -> Path:
    """A working directory in the state right after the plan checkpoint, with `shards` shards."""
    workdir = root / f"shards-{shards}"
    model = workdir / "target"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(FAKE_TARGET_CONFIG))
    # Config validation wants a tokenizer file to exist; the DAG never reads it.
    (model / "tokenizer.json").write_text("{}")
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


def snakemake(workdir: Path, *flags: str) -> tuple[subprocess.CompletedProcess, float]:
    """Snakemake on the default target in `workdir`, and its wall time (startup included)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        *flags,
    ]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    return result, time.perf_counter() - started


def dry_run(workdir: Path) -> tuple[int, float]:
    """(jobs planned, seconds) of `snakemake -n` for the default target in `workdir`."""
    result, seconds = snakemake(workdir, "--cores", "2", "-n")
    output = result.stdout + result.stderr
    totals = re.findall(r"^total\s+(\d+)\s*$", output, flags=re.MULTILINE)
    if result.returncode != 0 or not totals:
        sys.exit(f"snakemake -n failed in {workdir} (exit {result.returncode}):\n{output[-4000:]}")
    return int(totals[-1]), seconds


def pending_jobs(output: str) -> dict[str, int]:
    """Jobs per rule from the "Job stats" table snakemake prints ({} when nothing is to do)."""
    counts = re.findall(r"^([A-Za-z_]\w*)\s+(\d+)\s*$", output, flags=re.MULTILINE)
    return {rule: int(n) for rule, n in counts if rule != "total"}


def noop_run(workdir: Path) -> dict:
    """Time `snakemake --cores all` in a finished workflow directory. A dry run goes first: a
    directory with work left gets its pending jobs reported and is never run (that could start
    hours of jobs, and would not be a no-op timing)."""
    workdir = workdir.resolve()
    for needed in (workdir / "config.yaml", workdir / "results"):
        if not needed.exists():
            sys.exit(f"--noop-workdir: {needed} not found (a finished workflow directory?)")
    figures: dict = {"workdir": str(workdir), "command": "snakemake --cores all"}
    dry, seconds = snakemake(workdir, "--cores", "all", "-n")
    figures["dry_run_seconds"] = round(seconds, 3)
    output = dry.stdout + dry.stderr
    if dry.returncode != 0:
        sys.exit(f"snakemake -n failed in {workdir} (exit {dry.returncode}):\n{output[-4000:]}")
    figures["nothing_to_be_done"] = "Nothing to be done" in output
    figures["pending_jobs"] = {} if figures["nothing_to_be_done"] else pending_jobs(output)
    # jobs None: snakemake has work to do, but its job table could not be read.
    jobs = sum(figures["pending_jobs"].values())
    figures["jobs"] = 0 if figures["nothing_to_be_done"] else (jobs or None)
    figures["seconds"] = None
    if not figures["nothing_to_be_done"]:
        return figures
    run, seconds = snakemake(workdir, "--cores", "all")
    figures["seconds"] = round(seconds, 3)
    output = run.stdout + run.stderr
    if run.returncode != 0:
        sys.exit(f"snakemake failed in {workdir} (exit {run.returncode}):\n{output[-4000:]}")
    if "Nothing to be done" not in output:  # the dry run said nothing to do, yet jobs ran
        figures["nothing_to_be_done"] = False
        figures["pending_jobs"] = pending_jobs(output)
        figures["jobs"] = sum(figures["pending_jobs"].values()) or None
    return figures


def noop_row(noop: dict | None) -> Row:
    if noop is None:
        return Row("no-op `snakemake --cores all`",
                   "not timed: no finished workflow directory (--noop-workdir)")  # fmt: skip
    figure = f"no-op `snakemake --cores all` in {noop['workdir']}"
    goal = f"0 jobs in <= {GOAL_NOOP_SECONDS:g} s"
    if noop["seconds"] is None or not noop["nothing_to_be_done"]:
        pending = ", ".join(f"{rule} {n}" for rule, n in noop["pending_jobs"].items())
        done = "left, not run" if noop["seconds"] is None else "ran"
        value = f"{noop['jobs'] or 'some'} jobs {done} ({pending or 'job table not read'})"
        return Row(figure, value, goal, False, "noop")
    value = f"0 jobs, {noop['seconds']:.1f} s (its dry run {noop['dry_run_seconds']:.1f} s)"
    return Row(figure, value, goal, noop["seconds"] <= GOAL_NOOP_SECONDS, "noop.seconds")


def table_rows(f: dict) -> list[Row]:
    rows = []
    for run in f["dry_runs"]:
        goal = run["shards"] == GOAL_SHARDS
        rows.append(
            Row(
                f"`snakemake -n`, {run['shards']:,} shards ({run['jobs']:,} jobs planned)",
                f"{run['seconds']:.1f} s",
                f"<= {GOAL_SECONDS:g} s" if goal else "",
                run["seconds"] <= GOAL_SECONDS if goal else None,
                "dry_runs",
            )
        )
    return [*rows, noop_row(f.get("noop"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shards", default="100,1000,5000", help="comma-separated shard counts to plan"
    )
    parser.add_argument(
        "--noop-workdir", type=Path, help="a finished workflow directory: time a no-op run there"
    )
    output_arguments(parser, "dag_scale")
    args = parser.parse_args()
    counts = [int(n) for n in args.shards.split(",") if n.strip()]
    figures: dict = {
        "goal": {"shards": GOAL_SHARDS, "seconds": GOAL_SECONDS, "noop_seconds": GOAL_NOOP_SECONDS},
        "dry_runs": [],
    }

    print(f"goal: {GOAL_SHARDS:,} shards planned by `snakemake -n` in <= {GOAL_SECONDS:.0f} s\n")
    print("| shards | jobs planned | seconds |")
    print("|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        for shards in counts:
            jobs, seconds = dry_run(planned_workdir(Path(tmp), shards))
            print(f"| {shards:,} | {jobs:,} | {seconds:.1f} |", flush=True)
            figures["dry_runs"].append(
                {"shards": shards, "jobs": jobs, "seconds": round(seconds, 3)}
            )
    if args.noop_workdir:
        figures["noop"] = noop_run(args.noop_workdir)
    finish(args, "DAG scale", table_rows(figures), figures)


if __name__ == "__main__":
    main()
