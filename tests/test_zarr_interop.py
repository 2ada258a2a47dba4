"""Shards are plain zarr v3: a reader with only zarr + numcodecs (no eagleflow, no torch) gets
exactly the arrays the project's reader returns, for every codec of `CODECS`.

The foreign reader runs in a subprocess that imports nothing of this project, walks the group
(array names found by iterating it, not taken from the format) and dumps every array to an
.npz file; the test compares those arrays with what `open_shard` returns, and the token ids,
mask and offsets with the data appended.
Comparisons are exact (same dtype, bit-identical values) and nothing is skipped. The lossy
fp8 codec stores codes and scales, not what `sample_rows` returns: for it the test decodes the
plain reader's arrays with numpy alone, by the formula the README gives other readers, and
that must give `sample_rows`' bf16 bit patterns exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eagleflow.shards import (
    ACTIVATIONS,
    ARRAY_DTYPES,
    CODECS,
    LOSSY_CODECS,
    SCALE_SUFFIX,
    TOKEN_ARRAYS,
    ShardWriter,
    open_shard,
    stored_arrays,
)

A, H = 3, 8
CHUNK_BYTES = 4096  # aux: 85 rows a chunk, last: 256, input_ids: 1024, loss_mask: 4096
# Ragged samples; 4537 tokens leave a partial last chunk in every array (see CHUNK_BYTES).
LENGTHS = [1, 700, 1234, 85, 2000, 517]

# Codec names (zarr.json `codecs[].name`) our shards use, and where each is specified. A new
# name fails `test_codec_names_are_documented`: say in the README what other readers need.
KNOWN_CODEC_NAMES = {
    "bytes": "zarr v3 spec (zarr-specs)",
    "crc32c": "zarr v3 spec (zarr-specs)",
    "blosc": "zarr v3 spec (zarr-specs)",
    "zstd": "registered zarr extension (zarr-extensions), not the core spec",
    "numcodecs.shuffle": "numcodecs codec, outside the zarr v3 spec",
}

# The foreign reader: zarr, numcodecs, numpy and the standard library only. zarr-python >= 3.1.3
# registers `numcodecs.*` codec names itself (zarr.codecs.numcodecs); it needs the numcodecs
# package for their implementation (and for zstd and blosc), so import it explicitly.
READER = r"""
import json
import sys
import traceback

import numcodecs  # noqa: F401  (the codecs' implementation; zarr depends on it)
import numpy as np
import zarr

for path, out in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        group = zarr.open_group(path, mode="r", zarr_format=3)
        arrays = {}
        for name, node in group.members(max_depth=None):
            if isinstance(node, zarr.Array):
                arrays[name] = node[...]
        np.savez(out + ".npz", **arrays)
        with open(out + ".json", "w") as f:
            json.dump({"attrs": dict(group.attrs), "names": sorted(arrays)}, f)
    except Exception:
        with open(out + ".error", "w") as f:
            f.write(traceback.format_exc())
forbidden = sorted(m for m in sys.modules if m.split(".")[0] in ("eagleflow", "torch"))
if forbidden:
    sys.exit(f"the foreign reader imported {forbidden}")
"""


def make_samples(seed: int = 0) -> list[dict]:
    """Heavy-tailed finite bf16 activations (any codec must take them; arbitrary bit patterns,
    NaNs included, are tests/test_shards.py's business), random token ids and masks."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i, t in enumerate(LENGTHS):
        outliers = torch.where(torch.rand(t, 1, H, generator=gen) < 0.01, 300.0, 1.0)
        aux = torch.randn(t, A, H, generator=gen) * outliers
        samples.append(
            {
                "sample_id": f"s-{i}",
                "input_ids": rng.integers(0, 2**31 - 1, size=t),
                "loss_mask": rng.random(t) < 0.5,
                "aux": aux.bfloat16(),
                "last": aux[:, -1].mul(1.5).bfloat16(),
            }
        )
    return samples


def e4m3_to_float32(codes: np.ndarray) -> np.ndarray:
    """float8_e4m3fn codes decoded with numpy alone: sign, 4 exponent bits (bias 7), 3 mantissa
    bits; exponent 0 is subnormal (m/8 * 2^-6); 0x7F/0xFF are NaN (never written)."""
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7).astype(np.float64) / 8
    magnitude = np.where(
        exponent == 0, mantissa * 2.0**-6, (1 + mantissa) * 2.0 ** (exponent.astype(int) - 7)
    )
    return (sign * magnitude).astype(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch rounds float32 to bf16 (finite values)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def decode_fp8(codes: np.ndarray, scales: np.ndarray, rows_per_chunk: int) -> np.ndarray:
    """What another reader does with an fp8 shard's `aux`/`last`: codes times the scale row of
    their chunk, rounded to bf16 (README, "Lossy fp8 storage")."""
    chunk_of_row = np.arange(len(codes)) // rows_per_chunk
    return float32_to_bf16_bits(e4m3_to_float32(codes) * scales[chunk_of_row])


def token_data(samples: list[dict]) -> dict[str, np.ndarray]:
    """The arrays every codec stores as given (zstd, lossless), as they were appended."""
    return {
        "input_ids": np.concatenate([s["input_ids"] for s in samples]).astype(np.int32),
        "loss_mask": np.concatenate([s["loss_mask"] for s in samples]),
        "offsets": np.cumsum([0, *LENGTHS], dtype=np.int64),
    }


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return make_samples()


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory, samples: list[dict]) -> dict[str, Path]:
    """A shard per codec, all read by one foreign-reader subprocess (one interpreter start);
    codec -> shard path. Each shard's dump lies next to it as `shard-00000.npz` and `.json`
    (`.error` if plain zarr failed; `.write-error` if the shard could not be written)."""
    root = tmp_path_factory.mktemp("interop")
    paths = {}
    for codec in sorted(CODECS):
        path = root / codec / "shard-00000.zarr"
        try:
            with ShardWriter(
                path,
                aux_layer_ids=[2, 4, 5],
                last_layer_id=8,
                hidden_size=H,
                attrs={"backend": "test"},
                codec=codec,
                chunk_bytes=CHUNK_BYTES,
            ) as writer:
                for sample in samples:
                    writer.append(**sample)
        except Exception as error:  # fails that codec's test, not every codec's
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".write-error").write_text(f"{type(error).__name__}: {error}")
        paths[codec] = path
    written = [path for path in paths.values() if path.is_dir()]
    args = [str(x) for path in written for x in (path, path.with_suffix(""))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", READER, *args],
        cwd=root,  # not the repository (READER itself checks that nothing imported eagleflow)
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"foreign reader failed:\n{done.stdout}\n{done.stderr}"
    return paths


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_plain_zarr_reads_what_the_project_reads(
    foreign: dict[str, Path], samples: list[dict], codec: str
) -> None:
    path = foreign[codec]
    failed = path.with_suffix(".write-error")
    assert not failed.exists(), f"{codec}: ShardWriter failed: {failed.read_text()}"
    dump = path.with_suffix("")
    error = dump.with_suffix(".error")
    assert not error.exists(), f"{codec}: plain zarr cannot read the shard:\n{error.read_text()}"
    meta = json.loads(dump.with_suffix(".json").read_text())
    with np.load(dump.with_suffix(".npz")) as npz:
        theirs = {name: npz[name] for name in npz.files}
    declared = stored_arrays(codec)
    assert set(theirs) == set(meta["names"]) == set(declared), (
        f"{codec}: plain zarr finds arrays {sorted(theirs)}; the format declares "
        f"{sorted(declared)}. A codec that stores other arrays needs an explicit, documented "
        "decode step for other readers, here."
    )
    for name, dtype in declared.items():
        assert theirs[name].dtype == np.dtype(dtype), f"{codec}: {name} is {theirs[name].dtype}"

    shard = open_shard(path)
    assert meta["attrs"] == shard.attrs
    ours = {"offsets": shard.offsets}
    for name in TOKEN_ARRAYS:
        rows = [shard.sample_rows(i, copy=True)[name] for i in range(shard.num_samples)]
        ours[name] = np.concatenate(rows)
    want = token_data(samples)
    if codec in LOSSY_CODECS:  # decoded by the documented formula, with numpy alone
        for name in ACTIVATIONS:
            rows = shard.arrays[name].chunks[0]
            theirs[name] = decode_fp8(theirs[name], theirs[name + SCALE_SUFFIX], rows)
    for name, dtype in ARRAY_DTYPES.items():
        assert theirs[name].dtype == ours[name].dtype == np.dtype(dtype), (
            f"{codec}: {name}: plain zarr gives {theirs[name].dtype}, "
            f"sample_rows {ours[name].dtype}, the format declares {dtype}"
        )
        # Exact, never approximate: other readers see the stored arrays only, so if these
        # differ, the shard needs a documented decode step (and this test a matching one).
        assert np.array_equal(theirs[name], ours[name]), (
            f"{codec}: {name}: plain zarr's stored values differ from sample_rows'"
        )
        if name in want:  # not a vacuous match: both readers see the data appended
            assert np.array_equal(theirs[name], want[name]), f"{codec}: {name}: not as appended"


def test_codec_names_are_documented(foreign: dict[str, Path]) -> None:
    """Every codec name in the shards' metadata is one whose interop status we know."""
    used = {
        codec["name"]
        for path in foreign.values()
        for meta in path.glob("*/zarr.json")  # every array, whatever the format declares
        for codec in json.loads(meta.read_text())["codecs"]
    }
    assert used <= set(KNOWN_CODEC_NAMES), (
        f"codec names {sorted(used - set(KNOWN_CODEC_NAMES))} are new: check which zarr readers "
        "can open them and document it (README, KNOWN_CODEC_NAMES)"
    )
