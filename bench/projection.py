"""Disk projection error on a finished run: the final size `eagleflow.status` projects once the
first 10% of the shards are extracted (at least one; those that finished first), against the
size of all shards on disk.

Token totals are the finished run's (exact), as they are mid-run once `prepare` is done: the
error is the compression measured on the first shards against that of all of them.

The target's shape (aux layer count, hidden size) is read from the shards themselves, so no
config is needed. Goal: |error| <= 2%, as tests/test_status.py asserts on synthetic shards.

    .venv/bin/python bench/projection.py --results results
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from rows import Row, finish, output_arguments

from eagleflow.logs import InputError
from eagleflow.shards import open_shard
from eagleflow.status import projection_check

GOAL_ABS_ERROR = 0.02


def shard_shape(results: Path) -> tuple[int, int]:
    """(aux layer count, hidden size) of the run's first hidden shard."""
    stores = sorted((results / "hidden").glob("shard-*.zarr"))
    if not stores:
        raise InputError(f"{results}/hidden: no extracted shard")
    _tokens, num_aux, hidden_size = open_shard(stores[0]).arrays["aux"].shape
    return int(num_aux), int(hidden_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--fraction", type=float, default=0.1, help="of the shards measured")
    output_arguments(parser, "projection")
    args = parser.parse_args()
    try:
        num_aux, hidden_size = shard_shape(args.results)
        check = projection_check(
            args.results, num_aux=num_aux, hidden_size=hidden_size, fraction=args.fraction
        )
    except (InputError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    error = check.relative_error
    row = Row(
        f"final size projected from the first {check.shards_measured}/{check.shards_total} "
        "shards vs actual",
        f"{check.projected_bytes / 1e6:,.1f} vs {check.actual_bytes / 1e6:,.1f} MB ({error:+.2%})",
        f"abs(error) <= {GOAL_ABS_ERROR:.0%}",
        abs(error) <= GOAL_ABS_ERROR,
        "relative_error",
    )
    finish(args, "Disk projection error", [row], asdict(check))


if __name__ == "__main__":
    main()
