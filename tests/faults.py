"""Fault injection for the reliability suites: kill the workflow at a random moment of a stage,
corrupt hidden-state shards, then check that a plain rerun (or the one repair command `verify`
prints) restores outputs bit-identical to those of an uninterrupted run.

Each trial works on a fresh copy of a finished run (`reference`), so trials are independent and
the reference's outputs are the checksums to meet. `tests/test_faults.py` runs a few trials in
CI; `bench/faults.py` runs many and prints the tallies. Test tooling, not part of the package:
tests import it as `faults` (tests/ is on their path, as for conftest), bench scripts as
`tests.faults` (the repository root on theirs).
"""

from __future__ import annotations

import csv
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagleflow.files import sha256_file
from eagleflow.manifest import SNAKEMAKE_MARKER, store_checksums
from eagleflow.repair import planned_jobs
from eagleflow.shards import verify_shard
from eagleflow.verify import verify_results

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    rule: str
    target: str  # the Snakefile target that stops after this stage
    output: str  # output of one job, `{shard}` filled in for per-shard rules
    per_shard: bool
    state: tuple[str, ...] = ()  # what a fresh run of the stage starts without
    companions: tuple[str, ...] = ()  # the job's other outputs, like `output`

    def job_outputs(self, shard: str | None = None) -> list[str]:
        return [path.format(shard=shard) for path in (self.output, *self.companions)]


STAGES = {
    "generation": Stage("generate", "responses", "results/responses/shard-{shard}.jsonl", True),
    "extraction": Stage(
        "extract",
        "hidden",
        "results/hidden/shard-{shard}.zarr",
        True,
        companions=("results/hidden/shard-{shard}.sha256",),
    ),
    "training": Stage(
        "train",
        "drafter",
        "results/drafter/vllm",
        False,
        state=("results/checkpoints/drafter", "results/drafter/speculators"),
    ),
}

CORRUPTIONS = ("bit_flip", "truncate", "delete_chunk", "delete_shard")


def checksums(path: Path) -> dict[str, str]:
    """sha256 per file of a file or directory (keys relative to it), without the marker
    Snakemake adds to a directory output once the job is recorded: a job killed after its
    output was complete but before that has the same content."""
    if path.is_dir():
        sums = store_checksums(path)
        sums.pop(SNAKEMAKE_MARKER, None)
        return sums
    return {path.name: sha256_file(path)}


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "2",
        *args,
    ]  # fmt: skip


def snakemake(workdir: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run the workflow in `workdir`; raises with the output's tail when it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        snakemake_command(workdir, *args),
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise RuntimeError(f"snakemake {' '.join(args)} exited {result.returncode}:\n{tail}")
    return result


def scheduled_outputs(dry_run_stdout: str, prefix: str) -> list[str]:
    """Output paths starting with `prefix` that a `snakemake -n` listing schedules."""
    jobs = planned_jobs(dry_run_stdout)
    return sorted(out for job in jobs for out in job.outputs if out.startswith(prefix))


def planned_shards(workdir: Path) -> list[str]:
    return [
        s["shard"] for s in json.loads((workdir / "results/plan/plan.json").read_text())["shards"]
    ]


def _job_seconds(workdir: Path, rule: str, shards: list[str]) -> float:
    """Wall time the reference run's benchmark files recorded for these jobs."""
    names = [f"{rule}/shard-{s}.tsv" for s in shards] if shards else [f"{rule}.tsv"]
    total = 0.0
    for name in names:
        with open(workdir / "results/benchmarks" / name) as rows:
            total += float(next(csv.DictReader(rows, delimiter="\t"))["s"])
    return total


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


@dataclass
class CrashTrial:
    stage: str
    shards: list[str]  # shards whose outputs were removed (empty for training)
    kill_after_s: float  # after the stage's first job started
    complete_after_kill: list[str] = field(default_factory=list)  # outputs under final names
    partial_after_kill: list[str] = field(default_factory=list)  # final names, wrong content
    rescheduled: list[str] = field(default_factory=list)  # what `-n` then schedules
    resumed_from_step: int | None = None  # training: checkpoint step the rerun resumed from
    checkpoint_at_kill: int | None = None  # training: newest checkpoint left by the killed run
    verify_problems: dict[str, list[str]] = field(default_factory=dict)
    differing: list[str] = field(default_factory=list)  # outputs unlike the reference's

    @property
    def passed(self) -> bool:
        # The rerun redoes what was missing and nothing outside the removed outputs (a job
        # killed after writing its output but before Snakemake recorded it is redone too).
        missing = set(self.outputs) - set(self.complete_after_kill)
        scheduled = set(self.rescheduled) & set(self.outputs)
        # Training that finished before the kill is not rerun: nothing to resume.
        resumed_ok = self.stage != "training" or self.resumed_from_step in (
            None,
            self.checkpoint_at_kill or 0,
        )
        return (
            not self.partial_after_kill
            and missing <= scheduled
            and (not STAGES[self.stage].per_shard or set(self.rescheduled) <= set(self.outputs))
            and resumed_ok
            and not self.verify_problems
            and not self.differing
        )

    @property
    def outputs(self) -> list[str]:
        stage = STAGES[self.stage]
        if not stage.per_shard:
            return stage.job_outputs()
        return sorted(out for shard in self.shards for out in stage.job_outputs(shard))

    def summary(self) -> str:
        resumed = ""
        if self.stage == "training":
            resumed = (
                f", resumed at step {self.resumed_from_step} (checkpoint {self.checkpoint_at_kill})"
            )
        return (
            f"{self.stage} {','.join(self.shards)}: killed {self.kill_after_s:.1f} s into the "
            f"stage; {len(self.complete_after_kill)}/{len(self.outputs)} outputs complete, "
            f"{len(self.partial_after_kill)} partial under a final name, "
            f"{len(self.rescheduled)} rescheduled{resumed}; verify problems "
            f"{len(self.verify_problems)}, differing outputs {len(self.differing)}"
            + (" -> passed" if self.passed else " -> FAILED")
        )


def kill_when_running(workdir: Path, started: list[Path], delay_s: float, *args: str) -> None:
    """Run the workflow one job at a time; SIGKILL it and everything it started (engines,
    loader workers) `delay_s` after the first of `started` (job logs) appears."""
    run = subprocess.Popen(
        snakemake_command(workdir, "--jobs", "1", *args),
        cwd=workdir,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    deadline = time.monotonic() + 900
    while not any(p.exists() for p in started):
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the workflow ended before any of {started[0]}... started")
        time.sleep(0.2)
    time.sleep(delay_s)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    snakemake(workdir, "--unlock")  # a killed Snakemake leaves its lock; the user's next step


def _newest_checkpoint(workdir: Path) -> int | None:
    steps = [
        int(p.stem.split("-")[1])
        for p in (workdir / "results/checkpoints/drafter").glob("step-*.pt")
    ]
    return max(steps) if steps else None


def crash_trial(
    reference: Path,
    workdir: Path,
    stage_name: str,
    rng: random.Random,
    *,
    shards_per_trial: int = 2,
) -> CrashTrial:
    """Copy `reference` (a finished run) to `workdir`, remove one stage's outputs (a few random
    shards for per-shard stages), run the stage and SIGKILL it at a random moment, then rerun
    it plainly and compare with the reference."""
    stage = STAGES[stage_name]
    shutil.copytree(reference, workdir, symlinks=True)
    planned = planned_shards(workdir)
    shards = (
        sorted(rng.sample(planned, min(shards_per_trial, len(planned)))) if stage.per_shard else []
    )
    outputs = [o for s in shards for o in stage.job_outputs(s)] if shards else stage.job_outputs()
    logs = (
        [workdir / f"results/logs/{stage.rule}/shard-{s}.log" for s in shards]
        if shards
        else [workdir / f"results/logs/{stage.rule}.log"]
    )
    for path in [*outputs, *stage.state, *(str(p) for p in logs)]:
        _remove(workdir / path)
    # A moment in the first 80% of the time the jobs took in the reference run, engine start
    # included (the rest would often fall after the end on a less busy machine).
    trial = CrashTrial(
        stage_name, shards, rng.uniform(0.0, 0.8) * _job_seconds(reference, stage.rule, shards)
    )
    kill_when_running(workdir, logs, trial.kill_after_s, *outputs)

    for output in outputs:
        if (workdir / output).exists():
            same = checksums(workdir / output) == checksums(reference / output)
            (trial.complete_after_kill if same else trial.partial_after_kill).append(output)
    trial.complete_after_kill.sort()
    if stage_name == "training":
        trial.checkpoint_at_kill = _newest_checkpoint(workdir)
    dry = snakemake(workdir, "-n", *outputs).stdout
    trial.rescheduled = scheduled_outputs(dry, "results/" + stage.output.split("/")[1])
    snakemake(workdir, *outputs)
    if stage_name == "training" and trial.rescheduled:
        log = (workdir / "results/logs/train.log").read_text()
        resumed = log.split("resuming from checkpoint")
        trial.resumed_from_step = (
            int(resumed[1].split(" at step ")[1].split()[0]) if len(resumed) > 1 else 0
        )
    trial.verify_problems = verify_results(workdir / "results")
    trial.differing = [o for o in outputs if checksums(workdir / o) != checksums(reference / o)]
    return trial


@dataclass
class CorruptionTrial:
    injected: dict[str, str]  # shard -> corruption kind
    detected: list[str] = field(default_factory=list)  # shards verify named
    command: str = ""  # the repair command verify printed
    rescheduled_shards: list[str] = field(default_factory=list)  # shards the repair reran
    repair_output: str = ""
    differing: list[str] = field(default_factory=list)  # shards unlike the reference after repair
    # Outputs not made by the rerun jobs whose mtime the repair changed (should be none), and
    # what `snakemake -n` schedules afterwards but did not before the damage (should be none).
    touched_downstream: list[str] = field(default_factory=list)
    newly_stale: list[str] = field(default_factory=list)
    verify_after: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        hit = sorted(self.injected)
        return (
            self.detected == hit
            and self.rescheduled_shards == hit
            and not self.differing
            and not self.touched_downstream
            and not self.newly_stale
            and not self.verify_after
        )

    def summary(self) -> str:
        kinds = ", ".join(f"{s}:{k}" for s, k in sorted(self.injected.items()))
        return (
            f"injected {kinds}; verify named {len(self.detected)}/{len(self.injected)}; repair "
            f"reran {len(self.rescheduled_shards)} shard(s); {len(self.differing)} differ after "
            f"repair; {len(self.touched_downstream)} other outputs touched; "
            f"{len(self.newly_stale)} outputs newly stale; "
            f"verify after: {len(self.verify_after)} problems"
            + (" -> passed" if self.passed else " -> FAILED")
        )


def _chunk_files(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")


def corrupt_shard(store: Path, kind: str, rng: random.Random) -> str:
    """Damage one shard store in the way `kind` names; returns what was done."""
    if kind == "delete_shard":
        shutil.rmtree(store)
        return f"deleted {store.name}"
    chunk = rng.choice(_chunk_files(store))
    data = bytearray(chunk.read_bytes())
    if kind == "bit_flip":
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        chunk.write_bytes(bytes(data))
        return f"flipped bit {bit} of {chunk.relative_to(store)}"
    if kind == "truncate":
        keep = rng.randrange(len(data))
        chunk.write_bytes(bytes(data[:keep]))
        return f"truncated {chunk.relative_to(store)} from {len(data)} to {keep} bytes"
    if kind == "delete_chunk":
        chunk.unlink()
        return f"deleted chunk {chunk.relative_to(store)}"
    raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")


def detection_trial(
    store: Path, scratch: Path, kind: str, rng: random.Random
) -> tuple[str, list[str]]:
    """Damage a copy of one shard store; returns what was done and what `verify_shard` found.
    Cheap (no regeneration), so many corruptions can be tried."""
    copy = scratch / store.name
    shutil.copytree(store, copy)
    try:
        done = corrupt_shard(copy, kind, rng)
        return done, verify_shard(copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _output_mtimes(workdir: Path) -> dict[str, float]:
    """mtime of every file under results/ except the logs and benchmarks jobs rewrite."""
    results = workdir / "results"
    skip = ("logs", "benchmarks")
    return {
        p.relative_to(workdir).as_posix(): p.stat().st_mtime
        for p in results.rglob("*")
        if p.is_file() and p.relative_to(results).parts[0] not in skip
    }


def corruption_trial(
    reference: Path, workdir: Path, rng: random.Random, kinds: Sequence[str] = CORRUPTIONS
) -> CorruptionTrial:
    """Copy `reference`, damage one random shard per kind, run `verify`, run the repair command
    it prints, and compare with the reference: shards bit-identical, every other output left
    with its mtime, and nothing left for `snakemake -n` to do."""
    shards = planned_shards(reference)
    if len(kinds) > len(shards):
        raise ValueError(
            f"{reference}: {len(shards)} shard(s), fewer than the {len(kinds)} corruption kinds "
            "asked for (one shard each); pass fewer kinds"
        )
    shutil.copytree(reference, workdir, symlinks=True)
    victims = rng.sample(shards, len(kinds))
    trial = CorruptionTrial(injected=dict(zip(victims, kinds, strict=True)))
    stale_before = scheduled_outputs(snakemake(workdir, "-n").stdout, "results/")
    for shard, kind in trial.injected.items():
        corrupt_shard(workdir / f"results/hidden/shard-{shard}.zarr", kind, rng)
    check = subprocess.run(
        [sys.executable, "-m", "eagleflow.verify", "--results", "results"],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    trial.detected = sorted(verify_results(workdir / "results"))
    trial.command = check.stdout.strip().splitlines()[-1] if check.returncode == 1 else ""
    if trial.command:
        before = _output_mtimes(workdir)
        stores = shlex.split(trial.command)[3:]  # python -m eagleflow.repair STORE...
        repair = subprocess.run(
            [sys.executable, "-m", "eagleflow.repair", *stores, "--cores", "2", "--",
             "--snakefile", str(REPO / "Snakefile")],
            cwd=workdir, capture_output=True, text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )  # fmt: skip
        trial.repair_output = repair.stdout + repair.stderr[-4000:]
        if repair.returncode != 0:
            raise RuntimeError(f"repair exited {repair.returncode}:\n{trial.repair_output}")
        rerun = [line.split(" -> ")[1].split(", ") for line in repair.stdout.splitlines()
                 if line.startswith("repair: rerun ")]  # fmt: skip
        made = {out for outputs in rerun for out in outputs}
        trial.rescheduled_shards = sorted(
            p.split("shard-")[1].removesuffix(".zarr") for p in made if p.endswith(".zarr")
        )
        after = _output_mtimes(workdir)
        trial.touched_downstream = sorted(
            p for p in before.keys() & after.keys()
            if before[p] != after[p] and not any(p == m or p.startswith(m + "/") for m in made)
        )  # fmt: skip
        stale_after = scheduled_outputs(snakemake(workdir, "-n").stdout, "results/")
        trial.newly_stale = sorted(set(stale_after) - set(stale_before))
    trial.verify_after = verify_results(workdir / "results")
    for shard in victims:
        path = f"results/hidden/shard-{shard}.zarr"
        if not (workdir / path).exists() or checksums(workdir / path) != checksums(
            reference / path
        ):
            trial.differing.append(shard)
    return trial
