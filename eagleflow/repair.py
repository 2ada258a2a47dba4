"""Regenerate named hidden-state shards, and keep everything downstream up to date when a shard
comes back identical to the one the rest of the workflow consumed.

    python -m eagleflow.repair results/hidden/shard-00003.zarr [...] [-- SNAKEMAKE_ARGS]

`python -m eagleflow.verify` prints this command for the shards it finds corrupt or missing.
Snakemake reruns the jobs that make the named shards (extract jobs, or capture jobs in one
pass) and nothing else. Identity is measured against the shard's manifest (`shard-NNNNN.sha256`,
written next to the store when it was made), never against the damaged store itself. When every
output of a rerun job comes back byte-identical (the store against its manifest; other outputs,
such as one pass's responses, against their own bytes before the rerun), their modification
times are set back to what they were, so that Snakemake sees nothing newer than the drafter and
the evaluation that consumed them, and nothing downstream runs. When a shard comes back
different, its new mtime makes exactly its dependants stale, and the repair lists them.
Arguments after `--` go to every Snakemake call (e.g. `--configfile`, `--profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from eagleflow.files import sha256_file, write_json
from eagleflow.manifest import (
    SNAKEMAKE_MARKER,
    manifest_mismatches,
    manifest_path,
    read_manifest,
)


def _mtime_carrier(path: Path) -> Path:
    marker = path / SNAKEMAKE_MARKER
    return marker if path.is_dir() and marker.exists() else path


@dataclass
class Job:
    """One job the repair reruns: its rule and its outputs."""

    rule: str
    outputs: list[str]


def planned_jobs(dry_run_stdout: str) -> list[Job]:
    """The jobs a `snakemake -n` listing schedules, with their outputs."""
    jobs: list[Job] = []
    for line in dry_run_stdout.splitlines():
        stripped = line.strip()
        if line.startswith(("rule ", "checkpoint ", "localrule ")) and stripped.endswith(":"):
            jobs.append(Job(stripped.split()[1].rstrip(":"), []))
        elif stripped.startswith("output: ") and jobs:
            jobs[-1].outputs += stripped[len("output: ") :].split(", ")
    return jobs


@dataclass
class Before:
    """What an output was before the rerun: when Snakemake last saw it made, and its content."""

    mtime: float | None  # None: it did not exist
    digest: dict[str, str] | str | None  # a store's manifest, a file's sha256; None: unknown


def snapshot(output: Path) -> Before:
    """The state of `output` to compare the regenerated one with. A store is described by its
    manifest, never by its own (possibly damaged) files; a store lost with its marker takes the
    manifest's mtime, which was set right after the store was complete."""
    manifest = manifest_path(output)
    if output.suffix == ".zarr":
        digest = read_manifest(output)
        if output.exists():
            return Before(_mtime_carrier(output).stat().st_mtime, digest)
        return Before(manifest.stat().st_mtime if manifest.exists() else None, digest)
    if output.is_file():
        return Before(output.stat().st_mtime, sha256_file(output))
    return Before(None, None)


def journal_path(stores: list[str]) -> Path:
    """Where a repair keeps its snapshots until it has finished (beside the stores)."""
    return Path(stores[0]).parent / ".repair-journal.json"


def snapshots(outputs: list[str], journal: Path) -> dict[str, Before]:
    """The state of each output before the rerun, kept in `journal` until the repair finishes:
    a repair killed after regenerating a shard, rerun, must compare with (and restore) what the
    workflow consumed, not with the regenerated shard's new modification time."""
    recorded = json.loads(journal.read_text()) if journal.is_file() else {}
    before = {
        out: Before(**recorded[out]) if out in recorded else snapshot(Path(out)) for out in outputs
    }
    write_json(journal, {**recorded, **{out: asdict(b) for out, b in before.items()}})
    return before


def came_back_identical(output: Path, before: Before) -> bool:
    if before.digest is None or before.mtime is None or not output.exists():
        return False
    if output.suffix == ".zarr":  # the new store against the manifest of the old one
        return read_manifest(output) == before.digest and manifest_mismatches(output) == []
    return sha256_file(output) == before.digest


def restore_mtime(output: Path, mtime: float) -> None:
    """Set `output` (a directory output: its Snakemake marker too) back to `mtime`."""
    os.utime(output, (mtime, mtime))
    if output.is_dir() and (output / SNAKEMAKE_MARKER).exists():
        os.utime(output / SNAKEMAKE_MARKER, (mtime, mtime))


def _snakemake(args: list[str], capture: bool) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", *args]
    result = subprocess.run(command, capture_output=capture, text=True)
    if result.returncode != 0:
        output = (result.stdout or "") + (result.stderr or "") if capture else ""
        raise SystemExit(
            f"repair: {' '.join(command)} exited {result.returncode}\n{output[-4000:]}"
        )
    return result


def repair(stores: list[str], cores: str, snakemake_args: list[str]) -> int:
    """Rerun the jobs that make `stores`; returns the number of shards that came back different."""
    options = ["--cores", cores, "--forcerun", *stores, *snakemake_args]
    jobs = planned_jobs(_snakemake([*options, "-n", "--", *stores], capture=True).stdout)
    outputs = sorted({out for job in jobs for out in job.outputs})
    for job in jobs:
        print(f"repair: rerun {job.rule} -> {', '.join(job.outputs)}")
    journal = journal_path(stores)
    before = snapshots(outputs, journal)
    _snakemake([*options, "--", *stores], capture=False)

    changed = []
    for job in jobs:
        same = {out: came_back_identical(Path(out), before[out]) for out in job.outputs}
        if all(same.values()):
            for out in job.outputs:
                restore_mtime(Path(out), before[out].mtime)
            print(
                f"repair: {job.rule} ({', '.join(job.outputs)}): identical to what was "
                "consumed; modification times restored, nothing downstream is stale"
            )
        else:
            changed += [out for out, ok in same.items() if not ok]
    journal.unlink()
    if not changed:
        return 0
    for out in changed:
        reason = "no manifest to compare with" if before[out].digest is None else "content differs"
        print(f"repair: {out} came back different ({reason})")
    stale = planned_jobs(_snakemake(["--cores", cores, *snakemake_args, "-n"], capture=True).stdout)
    print(
        "repair: now stale, to be rerun by `snakemake`: "
        + (", ".join(sorted({job.rule for job in stale if job.outputs})) or "nothing")
    )
    return len(changed)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description="Regenerate hidden-state shards; downstream stays up to date if identical.",
        epilog="Arguments after -- go to snakemake (e.g. --configfile, --profile).",
    )
    parser.add_argument(
        "stores", nargs="+", help="shard stores, e.g. results/hidden/shard-00003.zarr"
    )
    parser.add_argument("--cores", default="all")
    args = parser.parse_args(own)
    bad = [s for s in args.stores if not s.endswith(".zarr")]
    if bad:
        parser.error(f"not a shard store path (…/shard-NNNNN.zarr): {', '.join(bad)}")
    repair(args.stores, args.cores, passthrough)
    return 0


if __name__ == "__main__":
    sys.exit(main())
