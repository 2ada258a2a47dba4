"""Crash and corruption trials in numbers: kill -9 at random moments of generation, extraction
and training, and random shard corruptions, each on a fresh copy of a finished run; prints every
trial and the tallies (trials run / passed, corruptions injected / detected / repaired).

    .venv/bin/python bench/faults.py --reference RUN_DIR --crash-trials 20 --corruption-trials 5

RUN_DIR is a finished run (e.g. the test config's: `snakemake --cores all` in a directory holding
tests/config.test.yaml as config.yaml); without --reference one is made in a temporary directory
(a few minutes: the demo target is built).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path

from eagleflow.faults import STAGES, corruption_trial, crash_trial, snakemake

REPO = Path(__file__).resolve().parents[1]


def make_reference(root: Path) -> Path:
    workdir = root / "reference"
    workdir.mkdir()
    shutil.copyfile(REPO / "tests/config.test.yaml", workdir / "config.yaml")
    snakemake(workdir, timeout=7200)
    return workdir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, help="a finished run (default: make one)")
    parser.add_argument("--crash-trials", type=int, default=20)
    parser.add_argument("--corruption-trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the tallies here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="eagleflow-faults-") as tmp:
        root = Path(tmp)
        reference = args.reference.resolve() if args.reference else make_reference(root)
        stages = list(STAGES)
        crash_passed = 0
        for i in range(args.crash_trials):
            trial = crash_trial(reference, root / f"crash-{i}", stages[i % len(stages)], rng)
            crash_passed += trial.passed
            print(f"crash {i + 1}/{args.crash_trials}: {trial.summary()}", flush=True)
            shutil.rmtree(root / f"crash-{i}")
        injected = detected = repaired = 0
        for i in range(args.corruption_trials):
            trial = corruption_trial(reference, root / f"corrupt-{i}", rng)
            injected += len(trial.injected)
            detected += len(set(trial.detected) & set(trial.injected))
            repaired += len(set(trial.injected) - set(trial.differing))
            print(f"corruption {i + 1}/{args.corruption_trials}: {trial.summary()}", flush=True)
            shutil.rmtree(root / f"corrupt-{i}")
    tallies = {
        "crash_trials": args.crash_trials,
        "crash_trials_passed": crash_passed,
        "corruptions_injected": injected,
        "corruptions_detected": detected,
        "corruptions_repaired_bit_identical": repaired,
    }
    print(
        f"\ncrash trials: {crash_passed}/{args.crash_trials} passed; corruptions: {injected} "
        f"injected, {detected} detected, {repaired} repaired bit-identically"
    )
    if args.json:
        args.json.write_text(json.dumps(tallies, indent=2) + "\n")


if __name__ == "__main__":
    main()
