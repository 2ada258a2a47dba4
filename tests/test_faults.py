"""Reliability suites in CI: kill -9 at random moments of generation, extraction and training;
bit flips, truncation, deleted chunk files and deleted shards. Each trial runs on a private copy
of the finished test run and must end bit-identical to it.

`bench/faults.py` runs the same trials in larger numbers.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from faults import CORRUPTIONS, corruption_trial, crash_trial, detection_trial

# Five trials over the three stages; trial i's seed is i (moments and shards differ).
CRASH_STAGES = ["generation", "extraction", "training", "extraction", "training"]


@pytest.mark.skipif(sys.platform != "linux", reason="process groups and SIGKILL")
@pytest.mark.parametrize("trial", range(len(CRASH_STAGES)))
def test_kill_at_a_random_moment_then_rerun_ends_bit_identical(
    demo_run: Path, tmp_path: Path, trial: int
) -> None:
    result = crash_trial(demo_run, tmp_path / "run", CRASH_STAGES[trial], random.Random(trial))
    print(result.summary())
    # Nothing half-written under a final name; the rerun redoes what the kill interrupted and
    # no output that was finished.
    assert not result.partial_after_kill, result.summary()
    interrupted = set(result.outputs) - set(result.complete_after_kill)
    assert interrupted <= set(result.rescheduled), result.summary()
    if result.stage != "training":
        assert set(result.rescheduled) <= set(result.outputs), result.summary()
    elif result.rescheduled:  # resumed from the newest checkpoint the killed run left
        assert result.resumed_from_step == (result.checkpoint_at_kill or 0), result.summary()
    assert not result.verify_problems, result.verify_problems
    assert not result.differing, result.summary()
    assert result.passed


def test_verify_detects_every_kind_of_corruption(demo_run: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    stores = sorted((demo_run / "results/hidden").glob("shard-*.zarr"))
    missed = []
    for kind in CORRUPTIONS:
        for _ in range(3):
            done, problems = detection_trial(rng.choice(stores), tmp_path, kind, rng)
            if not problems:
                missed.append(done)
    assert not missed


def test_corrupt_shard_is_named_and_repaired_bit_identically(
    demo_run: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "run"
    rng = random.Random(1)
    result = corruption_trial(demo_run, workdir, rng, kinds=[rng.choice(CORRUPTIONS)])
    print(result.summary(), result.repair_output, sep="\n")
    assert result.detected == sorted(result.injected), result.summary()
    hit = [f"results/hidden/shard-{s}.zarr" for s in sorted(result.injected)]
    assert result.command.split() == ["python", "-m", "eagleflow.repair", *hit]
    # The printed command reruns exactly the hit shard's job; the shard comes back identical to
    # what training consumed, so the drafter, the evaluation and every other output keep their
    # files and mtimes, and nothing is left to do.
    assert result.rescheduled_shards == sorted(result.injected), result.repair_output
    assert not result.differing, result.summary()  # sha256 of every file equal
    assert not result.touched_downstream, result.touched_downstream
    assert not result.newly_stale, result.newly_stale
    assert "identical to what was consumed" in result.repair_output
    assert not result.verify_after, result.verify_after


def test_corruption_trial_wants_a_shard_per_kind(demo_run: Path, tmp_path: Path) -> None:
    shards = len(list((demo_run / "results/hidden").glob("shard-*.zarr")))
    kinds = [CORRUPTIONS[i % len(CORRUPTIONS)] for i in range(shards + 1)]
    with pytest.raises(ValueError, match="fewer than"):
        corruption_trial(demo_run, tmp_path / "run", random.Random(0), kinds)
    assert not (tmp_path / "run").exists()  # said before copying anything
