"""A shard store's manifest: the sha256 of every file of the store as written, kept next to it.

`shard-NNNNN.sha256` beside `shard-NNNNN.zarr`, in `sha256sum -c` format (run it in the folder
that holds both). It is what a regenerated shard is compared with (`eagleflow.repair`): a
corrupt store cannot vouch for itself. The writer hashes chunk files while they are in memory
(`file_digests`' `known`), so the manifest costs no second read of the data.
"""

from __future__ import annotations

from pathlib import Path

from eagleflow.files import atomic_output, sha256_file, tree_files


def file_digests(
    root: Path, known: dict[Path, str] | None = None, files: list[Path] | None = None
) -> dict[str, str]:
    """sha256 of every file under `root` (or of `files`, a listing of it) by relative posix
    path; `known` ones are not reread."""
    known = known or {}
    return {
        file.relative_to(root).as_posix(): known.get(file) or sha256_file(file)
        for file in (tree_files(root) if files is None else files)
    }


def store_checksums(path: str | Path) -> dict[str, str]:
    """sha256 of every file in the store, by path relative to it (proves bit-identity)."""
    return file_digests(Path(path))


def manifest_path(store: str | Path) -> Path:
    """The manifest of the store `store`: `shard-NNNNN.zarr` -> `shard-NNNNN.sha256`."""
    return Path(store).with_suffix(".sha256")


# The marker Snakemake puts in a directory output once its job is recorded (its mtime is the
# directory's for Snakemake): not part of the store's content.
SNAKEMAKE_MARKER = ".snakemake_timestamp"


def write_manifest(store: str | Path, digests: dict[str, str]) -> None:
    """Write the manifest of `store` (sha256 by path relative to the store), atomically."""
    store = Path(store)
    with atomic_output(manifest_path(store)) as tmp:
        tmp.write_text("".join(f"{d}  {store.name}/{f}\n" for f, d in sorted(digests.items())))


def read_manifest(store: str | Path) -> dict[str, str] | None:
    """The digests the manifest of `store` records (None when there is no manifest)."""
    store = Path(store)
    try:
        lines = manifest_path(store).read_text().splitlines()
    except FileNotFoundError:
        return None
    prefix = f"{store.name}/"
    return {
        name.removeprefix(prefix): digest for digest, name in (ln.split("  ", 1) for ln in lines)
    }


def manifest_mismatches(store: str | Path) -> list[str] | None:
    """Files of `store` whose content differs from its manifest (missing and extra files
    included); None when there is no manifest to compare with."""
    recorded = read_manifest(store)
    if recorded is None:
        return None
    actual = store_checksums(store) if Path(store).is_dir() else {}
    actual.pop(SNAKEMAKE_MARKER, None)
    return sorted(f for f in recorded.keys() | actual.keys() if recorded.get(f) != actual.get(f))
