"""Reading shards: `open_shard`, and row readers that decode chunk by chunk through a cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from eagleflow.files import tree_bytes
from eagleflow.shards.chunks import ChunkCache, _ChunkFiles
from eagleflow.shards.format import (
    ACTIVATIONS,
    ARRAY_DTYPES,
    DEFAULT_CODEC,
    LOSSY_CODECS,
    SCALE_SUFFIX,
    TOKEN_ARRAYS,
    _quiet,
    stored_arrays,
    uint16_to_bf16,
)
from eagleflow.shards.fp8 import dequantize


def _chunk_nbytes(array: zarr.Array) -> int:
    return array.chunks[0] * int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize


class _RowReader:
    """Reads row ranges of one array chunk by chunk, through a cache of decoded chunks.

    Consecutive ranges (sample after sample) decode every chunk once even with a tiny cache.
    """

    def __init__(self, array: zarr.Array, directory: Path, cache: ChunkCache) -> None:
        self.array, self.cache, self.key = array, cache, (str(directory),)
        self.files = _ChunkFiles.for_array(array, directory)
        self.rows = array.chunks[0]
        self.total = array.shape[0]
        self.dtype = array.dtype  # of the rows returned

    def _decode(self, index: int) -> np.ndarray:
        start = index * self.rows
        stop = min(self.total, start + self.rows)
        if self.files is None:
            return self.array[start:stop]
        self.files.prefetch(index + 1)
        return self.files.read(index)[: stop - start]

    def _chunk(self, index: int) -> np.ndarray:
        return self.cache.get((*self.key, index), lambda: self._decode(index))

    def read(self, start: int, stop: int, copy: bool = True) -> np.ndarray:
        """Rows `start`..`stop`; without `copy`, a read-only view into the cache where they lie
        in one chunk (for callers that copy them anyway)."""
        parts = []
        for index in range(start // self.rows, -(-stop // self.rows)):
            base = index * self.rows
            block = self._chunk(index)
            block.flags.writeable = False  # the cache's own: callers get views or copies
            parts.append(block[max(start, base) - base : min(stop, base + len(block)) - base])
        if not parts:
            return np.empty((0, *self.array.shape[1:]), dtype=self.dtype)
        if len(parts) > 1:
            return np.concatenate(parts)
        return parts[0].copy() if copy else parts[0]


class _Fp8RowReader(_RowReader):
    """Rows of an fp8 activation array, decoded to bf16 bit patterns with their chunk's scales."""

    def __init__(
        self, array: zarr.Array, scales: zarr.Array, directory: Path, cache: ChunkCache
    ) -> None:
        super().__init__(array, directory, cache)
        self.scale_files = _ChunkFiles.for_array(scales, directory.with_name(scales.basename))
        if self.files is None or self.scale_files is None:
            raise ValueError(f"{directory}: fp8 arrays must be chunked along the token axis only")
        self.dtype = np.dtype(np.uint16)

    def _decode(self, index: int) -> np.ndarray:
        stop = min(self.total, (index + 1) * self.rows) - index * self.rows
        self.files.prefetch(index + 1)
        codes = self.files.read(index)[:stop]
        return dequantize(codes, self.scale_files.read(index)[0])


class Shard:
    """A shard opened for reading (see `open_shard`). Not safe to share between threads."""

    def __init__(self, path: str | Path, cache: ChunkCache | None = None) -> None:
        self.path = Path(path)
        if not (self.path / "zarr.json").is_file():
            raise FileNotFoundError(f"{self.path}: not a shard (no zarr.json)")
        with _quiet():
            self.group = zarr.open_group(self.path, mode="r", zarr_format=3)
            self.attrs: dict[str, Any] = dict(self.group.attrs)
            self.codec: str = self.attrs.get("codec", DEFAULT_CODEC)
            names = stored_arrays(self.codec)
            self.arrays: dict[str, zarr.Array] = {name: self.group[name] for name in names}
        self.offsets: np.ndarray = self.arrays["offsets"][:]
        self.sample_ids: list[str] = list(self.attrs["sample_ids"])
        # Without a shared cache, each array keeps its last two chunks: enough for sequential reads.
        self._readers: dict[str, _RowReader] = {}
        for name in TOKEN_ARRAYS:
            array = self.arrays[name]
            if name in ACTIVATIONS and self.codec in LOSSY_CODECS:  # decoded to 2-byte bf16
                scales = self.arrays[name + SCALE_SUFFIX]
                own_cache = cache or ChunkCache(4 * _chunk_nbytes(array))
                self._readers[name] = _Fp8RowReader(array, scales, self.path / name, own_cache)
            else:
                own_cache = cache or ChunkCache(2 * _chunk_nbytes(array))
                self._readers[name] = _RowReader(array, self.path / name, own_cache)

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return self.num_samples

    def sample(self, i: int) -> dict[str, Any]:
        """Sample `i`: sample_id, input_ids (int64), loss_mask (bool), aux [T, A, H] and last
        [T, H] as bf16 tensors. Reading consecutive samples decodes each chunk once."""
        rows = self.sample_rows(i, copy=True)
        return {
            "sample_id": self.sample_ids[i],
            "input_ids": torch.from_numpy(rows["input_ids"].astype(np.int64)),
            "loss_mask": torch.from_numpy(rows["loss_mask"]),
            "aux": uint16_to_bf16(rows["aux"]),
            "last": uint16_to_bf16(rows["last"]),
        }

    def sample_rows(self, i: int, copy: bool = False) -> dict[str, np.ndarray]:
        """Sample `i`'s rows of the token arrays as stored (activations as uint16 bit
        patterns); without `copy`, read-only views into the chunk cache where possible, for a
        reader that copies them into a batch anyway (the training loader)."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for {self.num_samples} samples")
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        return {name: reader.read(start, stop, copy) for name, reader in self._readers.items()}

    def iter_samples(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Samples `start`..`stop` (exclusive) in order, each chunk decoded once."""
        stop = self.num_samples if stop is None else min(stop, self.num_samples)
        for i in range(start, stop):
            yield self.sample(i)

    def nbytes_raw(self, names: tuple[str, ...] = tuple(ARRAY_DTYPES)) -> int:
        """Uncompressed bytes of the named arrays (all by default) in their logical dtypes:
        activations as bf16 whatever the codec, so raw / stored is the saving over bf16."""
        return sum(self.arrays[name].size * np.dtype(ARRAY_DTYPES[name]).itemsize for name in names)

    def nbytes_stored(self, names: tuple[str, ...] | None = None) -> int:
        """Bytes on disk of the named arrays (an fp8 array's scales included), or of the whole
        store (metadata included)."""
        if names is None:
            return tree_bytes(self.path)
        with_scales = [n + s for n in names for s in ("", SCALE_SUFFIX) if n + s in self.arrays]
        return sum(self.arrays[name].nbytes_stored() for name in with_scales)


def open_shard(path: str | Path, cache: ChunkCache | None = None) -> Shard:
    """Open the shard at `path` for reading (decoded chunks kept in `cache` when given)."""
    return Shard(path, cache)
