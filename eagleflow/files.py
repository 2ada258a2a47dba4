"""Atomic outputs: a file or directory appears under its final name only when complete."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagleflow.logs import InputError


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def tree_files(root: Path) -> list[Path]:
    """Every file under `root`, sorted."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def tree_bytes(root: Path) -> int:
    """Bytes of every file under `root`."""
    return sum(f.stat().st_size for f in tree_files(root))


@contextlib.contextmanager
def atomic_output(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `final` only if the block succeeds.

    A crash leaves at most a `.tmp-*` sibling, never a partial file under the final name, so
    Snakemake (and a user listing the folder) never mistakes a half-written output for a done one.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}")
    _remove(tmp)  # a leftover of an earlier crash
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if final.is_dir() and tmp.is_dir():
        _remove(final)
    os.replace(tmp, final)


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """Write one compact JSON object per line, atomically."""
    with atomic_output(path) as tmp, tmp.open("w") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a JSONL file (blank lines ignored); a bad line is named by file and line."""
    records = []
    with open(path) as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"{path}, line {number}: not JSON ({err.msg})") from None
    return records
