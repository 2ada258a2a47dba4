"""`verify_shard`: everything that can be wrong with a shard on disk, as a list of problems."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import zarr

from eagleflow.shards.format import (
    ACTIVATIONS,
    CODECS,
    DEFAULT_CODEC,
    FORMAT_ATTRS,
    FORMAT_VERSION,
    LOGICAL_DTYPE,
    SCALE_SUFFIX,
    _quiet,
    stored_arrays,
)


def _verify_chunks(path: Path, name: str, array: zarr.Array, budget: int) -> list[str]:
    """Every chunk file of `array` exists and decodes (crc32c included)."""
    problems = []
    keys = (
        array.metadata.encode_chunk_key(coords)
        for coords in itertools.product(*(range(n) for n in array.cdata_shape))
    )
    missing = [key for key in keys if not (path / name / key).is_file()]
    if missing:
        problems.append(f"{path}: {name}: {len(missing)} chunk file(s) missing, e.g. {missing[:3]}")
    rows = array.chunks[0]
    chunk_nbytes = int(np.prod(array.chunks, dtype=np.int64)) * array.dtype.itemsize
    step = rows * max(1, budget // chunk_nbytes)
    for block in range(0, array.shape[0], step):
        try:
            array[block : block + step]
        except Exception:  # find the chunks of the block that fail
            for start in range(block, min(block + step, array.shape[0]), rows):
                try:
                    array[start : start + rows]
                except Exception as error:
                    problems.append(
                        f"{path}: {name}: chunk at row {start} unreadable: "
                        f"{type(error).__name__}: {error}"
                    )
    return problems


def _verify(path: Path, budget: int) -> list[str]:
    if not path.is_dir():
        return [f"{path}: shard store missing"]
    try:
        with _quiet():
            group = zarr.open_group(path, mode="r", zarr_format=3)
        attrs = dict(group.attrs)
    except Exception as error:
        return [f"{path}: cannot open the group: {type(error).__name__}: {error}"]
    problems = [f"{path}: attribute {key!r} missing" for key in FORMAT_ATTRS if key not in attrs]
    arrays = {}
    codec = attrs.get("codec", DEFAULT_CODEC)
    if codec not in CODECS:
        return [*problems, f"{path}: unknown codec {codec!r}"]
    for name, dtype in stored_arrays(codec).items():
        try:
            with _quiet():
                array = group[name]
        except Exception as error:
            problems.append(f"{path}: array {name!r} missing or unreadable: {error!r}")
            continue
        if not isinstance(array, zarr.Array) or array.dtype != np.dtype(dtype):
            problems.append(f"{path}: {name} is not a {dtype} array")
        else:
            arrays[name] = array
    if problems:
        return problems

    a, h = len(attrs["aux_layer_ids"]), attrs["hidden_size"]
    t, s = attrs["num_tokens"], attrs["num_samples"]
    expected = {"aux": (t, a, h), "last": (t, h), "input_ids": (t,), "loss_mask": (t,)}
    expected["offsets"] = (s + 1,)
    for name in ACTIVATIONS:  # fp8: a row of scales per chunk of the codes
        if name + SCALE_SUFFIX in arrays:
            chunks = -(-t // arrays[name].chunks[0])
            expected[name + SCALE_SUFFIX] = (chunks, *expected[name][1:])
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            problems.append(
                f"{path}: {name} has shape {arrays[name].shape}, attributes say {shape}"
            )
    if attrs["format_version"] != FORMAT_VERSION:
        problems.append(f"{path}: format_version {attrs['format_version']} != {FORMAT_VERSION}")
    if attrs["logical_dtype"] != LOGICAL_DTYPE:
        problems.append(f"{path}: logical_dtype {attrs['logical_dtype']!r} != {LOGICAL_DTYPE!r}")
    if len(set(attrs["aux_layer_ids"])) != a:
        problems.append(f"{path}: aux_layer_ids not distinct: {attrs['aux_layer_ids']}")
    if len(attrs["sample_ids"]) != s:
        problems.append(f"{path}: {len(attrs['sample_ids'])} sample_ids for num_samples {s}")

    for name, array in arrays.items():
        problems += _verify_chunks(path, name, array, budget)
    offsets = arrays["offsets"][:]
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != t or np.any(np.diff(offsets) < 0)):
        problems.append(f"{path}: offsets must start at 0, never decrease and end at {t}")
    return problems


def verify_shard(path: str | Path, *, read_budget: int = 64 * 2**20) -> list[str]:
    """Problems with the shard at `path`, each naming it (empty list = clean); never raises.

    Checks required attributes and their consistency, array presence, dtypes and shapes, the
    offsets, that every expected chunk file exists (zarr would silently read a missing chunk as
    zeros), and that every chunk decodes with a matching crc32c. Reads at most `read_budget`
    bytes at a time.
    """
    path = Path(path)
    try:
        return _verify(path, read_budget)
    except Exception as error:  # attributes of the wrong type, say
        return [f"{path}: malformed shard: {type(error).__name__}: {error}"]
