"""Verify every planned hidden-state shard and print the one command that repairs the bad ones.

    python -m eagleflow.verify [--results results]

Reads every chunk (crc32c makes a flipped bit fail loudly), checks shapes, offsets, attributes,
the metadata files against the shard's manifest, and that each shard holds exactly the samples
`prepare` wrote for it. Exit status 1 when any shard is corrupt or missing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from eagleflow.files import read_jsonl, sha256_file
from eagleflow.manifest import manifest_path, read_manifest
from eagleflow.shards import open_shard, verify_shard


def shard_problems(results: Path, shard: str) -> list[str]:
    """Problems of one planned shard (empty when clean)."""
    store = results / "hidden" / f"shard-{shard}.zarr"
    if not store.exists():
        return [f"{store}: missing"]
    problems = verify_shard(store) + metadata_problems(store)
    tokens = results / "tokens" / f"shard-{shard}.jsonl"
    if not problems and tokens.exists():
        expected = [s["id"] for s in read_jsonl(tokens)]
        if open_shard(store).sample_ids != expected:
            problems.append(f"{store}: sample ids differ from {tokens}")
    return problems


def metadata_problems(store: Path) -> list[str]:
    """The store's manifest, written once the store is complete, and its metadata files (which
    no chunk checksum covers: a flipped layer id would pass) against it. Chunks are checked by
    their checksums instead of rehashing hundreds of GB here."""
    recorded = read_manifest(store)
    if recorded is None:
        return [f"{manifest_path(store)}: missing (written once the shard is complete)"]
    problems = []
    for name in sorted(n for n in recorded if Path(n).name == "zarr.json"):
        path = store / name
        if not path.is_file() or sha256_file(path) != recorded[name]:
            problems.append(f"{path}: differs from {manifest_path(store)}")
    return problems


def verify_results(results: str | Path) -> dict[str, list[str]]:
    """Problems per planned shard id, for the shards that have any."""
    results = Path(results)
    shards = json.loads((results / "plan" / "plan.json").read_text())["shards"]
    report = {}
    for shard in shards:
        problems = shard_problems(results, shard["shard"])
        if problems:
            report[shard["shard"]] = problems
    return report


def repair_command(results: Path, bad_shards: list[str]) -> str:
    """The command that regenerates exactly these shards (see eagleflow.repair): what depends
    on them reruns only if a shard comes back different from what it consumed."""
    paths = [str(results / "hidden" / f"shard-{s}.zarr") for s in bad_shards]
    return shlex.join(["python", "-m", "eagleflow.repair", *paths])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Verify hidden-state shards.")
    parser.add_argument("--results", default="results", type=Path)
    args = parser.parse_args(argv)
    report = verify_results(args.results)
    planned = len(json.loads((args.results / "plan" / "plan.json").read_text())["shards"])
    if not report:
        print(f"all {planned} shards clean")
        return 0
    for problems in report.values():
        for problem in problems:
            print(problem)
    print(f"\n{len(report)} of {planned} shards need regenerating; run:")
    print(repair_command(args.results, sorted(report)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
