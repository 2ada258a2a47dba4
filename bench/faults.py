"""Crash and corruption trials in numbers: kill -9 at random moments of generation, extraction
and training, and random shard corruptions, each on a fresh copy of a finished run; prints every
trial and the tallies (trials run / passed, corruptions injected / detected / repaired).

    .venv/bin/python bench/faults.py --reference RUN_DIR --crash-trials 20 --corruption-trials 5

RUN_DIR is a finished run (e.g. the test config's: `snakemake --cores all` in a directory holding
tests/config.test.yaml as config.yaml); without --reference one is made in a temporary directory
(a few minutes: the demo target is built). A corruption trial damages one shard per kind (bit
flip, truncated chunk, deleted chunk, deleted shard): on a run of fewer shards than kinds, each
trial takes as many kinds as there are shards, the kinds rotating from trial to trial.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

from rows import REPO, Row, finish, finished_run, output_arguments

sys.path.insert(0, str(REPO))

from eagleflow.repair import planned_jobs
from tests.faults import (
    CORRUPTIONS,
    STAGES,
    corruption_trial,
    crash_trial,
    planned_shards,
    snakemake,
)


def make_reference(root: Path) -> Path:
    workdir = root / "reference"
    workdir.mkdir()
    shutil.copyfile(REPO / "tests/config.test.yaml", workdir / "config.yaml")
    snakemake(workdir, timeout=7200)
    return workdir


def jobs_left(run: Path) -> list[str]:
    """Rules `snakemake -n` would still run in `run` with this checkout's workflow (a trial's
    rerun would redo them too, and fail): none for a reference to measure against."""
    dry = snakemake(run, "-n")
    if "Nothing to be done" in dry.stdout + dry.stderr:
        return []
    return sorted({job.rule for job in planned_jobs(dry.stdout)}) or ["(jobs not read)"]


def table_rows(f: dict) -> list[Row]:
    injected = f["corruptions_injected"]
    return [
        Row(
            "crash trials passed",
            f"{f['crash_trials_passed']}/{f['crash_trials']}",
            "all",
            f["crash_trials_passed"] == f["crash_trials"],
            "crash_trials_passed",
        ),
        Row(
            "corruptions detected by verify",
            f"{f['corruptions_detected']}/{injected}",
            "all",
            f["corruptions_detected"] == injected,
            "corruptions_detected",
        ),
        Row(
            "corruptions repaired bit-identically",
            f"{f['corruptions_repaired_bit_identical']}/{injected}",
            "all",
            f["corruptions_repaired_bit_identical"] == injected,
            "corruptions_repaired_bit_identical",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference",
        type=finished_run("results/hidden", "results/benchmarks", "results/drafter/vllm"),
        help="a finished run (default: make one)",
    )
    parser.add_argument("--crash-trials", type=int, default=20)
    parser.add_argument("--corruption-trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    output_arguments(parser, "faults")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="eagleflow-faults-") as tmp:
        root = Path(tmp)
        reference = args.reference or make_reference(root)
        if left := jobs_left(reference):
            sys.exit(
                f"--reference {reference}: not finished with this checkout's workflow; snakemake "
                f"would still run {', '.join(left)} (code, params or inputs changed since). "
                "Run `snakemake --cores all` there (or in a copy) first."
            )
        shards = planned_shards(reference)
        per_trial = min(len(CORRUPTIONS), len(shards))
        print(f"{reference}: {len(shards)} shard(s); {per_trial} corruption(s) per trial")
        stages = list(STAGES)
        crash_passed = 0
        for i in range(args.crash_trials):
            trial = crash_trial(reference, root / f"crash-{i}", stages[i % len(stages)], rng)
            crash_passed += trial.passed
            print(f"crash {i + 1}/{args.crash_trials}: {trial.summary()}", flush=True)
            shutil.rmtree(root / f"crash-{i}")
        injected = detected = repaired = 0
        for i in range(args.corruption_trials):
            kinds = [CORRUPTIONS[(i * per_trial + k) % len(CORRUPTIONS)] for k in range(per_trial)]
            trial = corruption_trial(reference, root / f"corrupt-{i}", rng, kinds)
            injected += len(trial.injected)
            detected += len(set(trial.detected) & set(trial.injected))
            repaired += len(set(trial.injected) - set(trial.differing))
            print(f"corruption {i + 1}/{args.corruption_trials}: {trial.summary()}", flush=True)
            shutil.rmtree(root / f"corrupt-{i}")
    tallies = {
        "shards": len(shards),
        "crash_trials": args.crash_trials,
        "crash_trials_passed": crash_passed,
        "corruptions_injected": injected,
        "corruptions_detected": detected,
        "corruptions_repaired_bit_identical": repaired,
    }
    finish(args, "Fault tallies", table_rows(tallies), tallies)


if __name__ == "__main__":
    main()
