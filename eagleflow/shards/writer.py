"""`ShardWriter`: streams samples into a new shard, atomically, encoding chunks on a thread pool."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from eagleflow.files import atomic_output, tree_files
from eagleflow.manifest import file_digests, manifest_path, write_manifest
from eagleflow.shards.columns import _Column, _Fp8Column, _rows_per_chunk
from eagleflow.shards.format import (
    ACTIVATIONS,
    ARRAY_DTYPES,
    CODECS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CODEC,
    FORMAT_VERSION,
    LOGICAL_DTYPE,
    LOSSY_CODECS,
    SCALE_SUFFIX,
    WRITER_ATTRS,
    _quiet,
    bf16_to_uint16,
    stored_arrays,
)


def _activation_bits(x: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return bf16_to_uint16(x)
    if isinstance(x, np.ndarray) and x.dtype == np.uint16:
        return x
    raise TypeError(f"{name}: expected a bf16 tensor or a uint16 array, got {type(x).__name__}")


def _as_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _lowest_priority() -> None:
    """Put the calling thread in Linux's SCHED_IDLE class (elsewhere: leave it as it is)."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class ShardWriter:
    """Stream samples into a new shard; it appears under `path` only when closed successfully.

    Use as a context manager. Everything is written under a temporary sibling (`.tmp-<name>`,
    a stale one removed first) and renamed onto `path` on a clean exit; on an exception the
    temporary store is removed and nothing appears under `path`. Memory stays bounded: each
    array buffers at most one chunk of rows. The same samples appended in the same order give
    byte-identical files, whatever `encode_threads`.

    `encode_threads` > 0 encodes and writes chunk files on that many threads (zstd and numpy
    release the GIL), at most two chunks per thread queued, so that encoding overlaps the
    work that produces the samples. `encode_idle` runs those threads at the lowest CPU priority
    (Linux SCHED_IDLE) for when that work computes on this machine's cores: they then only take
    cores its threads leave idle (an OpenMP engine stalls at every barrier where one of its
    threads lost its core), and a full queue makes `append` wait, which frees the cores.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        aux_layer_ids: list[int],
        last_layer_id: int,
        hidden_size: int,
        attrs: dict[str, Any],
        codec: str = DEFAULT_CODEC,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        encode_threads: int = 0,
        encode_idle: bool = False,
    ) -> None:
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}; choose one of {sorted(CODECS)}")
        if len(set(aux_layer_ids)) != len(aux_layer_ids) or not aux_layer_ids:
            raise ValueError(f"aux_layer_ids must be distinct and non-empty: {aux_layer_ids}")
        reserved = sorted(set(attrs) & set(WRITER_ATTRS))
        if reserved:
            raise ValueError(f"attrs may not set format attributes {reserved}")
        self.path = Path(path)
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.last_layer_id = int(last_layer_id)
        self.hidden_size = int(hidden_size)
        self.attrs = dict(attrs)
        self.codec = codec
        self.chunk_bytes = int(chunk_bytes)
        self.sample_ids: list[str] = []
        self._seen: set[str] = set()
        self.offsets = [0]
        self._atomic: contextlib.AbstractContextManager[Path] | None = None
        self._group: zarr.Group | None = None
        self._columns: dict[str, _Column] = {}
        self.encode_threads = int(encode_threads)
        self.encode_idle = encode_idle
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()
        self._digests: dict[Path, str] = {}  # chunk files hashed as they were written
        self._tmp = self.path
        self._manifest: dict[str, str] = {}

    @property
    def num_samples(self) -> int:
        return len(self.sample_ids)

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    def __enter__(self) -> ShardWriter:
        manifest_path(self.path).unlink(missing_ok=True)  # it would describe the old store
        self._atomic = atomic_output(self.path)
        tmp = self._atomic.__enter__()
        self._tmp = tmp
        try:
            self._group = zarr.open_group(tmp, mode="w", zarr_format=3)
            if self.encode_threads:
                idle = _lowest_priority if self.encode_idle else None
                self._pool = ThreadPoolExecutor(self.encode_threads, "shard-encode", idle)
            a, h = len(self.aux_layer_ids), self.hidden_size
            shapes = {"aux": (a, h), "last": (h,), "input_ids": (), "loss_mask": ()}
            for name, inner in shapes.items():
                array = self._create(name, (0, *inner))
                column_args = (self._submit, bool(self._pool), self._digests)
                if name in ACTIVATIONS and self.codec in LOSSY_CODECS:
                    scales = self._create(name + SCALE_SUFFIX, (0, *inner))
                    self._columns[name] = _Fp8Column(array, scales, tmp / name, *column_args)
                else:
                    self._columns[name] = _Column(array, tmp / name, *column_args)
        except BaseException as error:
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def _create(self, name: str, shape: tuple[int, ...]) -> zarr.Array:
        dtype = np.dtype(stored_arrays(self.codec)[name])
        # Activations: chunks of `chunk_bytes` of bf16 whatever the codec, so that a lossy
        # shard has the same rows per chunk as a lossless one; a scale array: a row per chunk.
        logical = np.dtype(ARRAY_DTYPES.get(name, "uint16"))
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * logical.itemsize
        rows = 1 if name.endswith(SCALE_SUFFIX) else _rows_per_chunk(row_bytes, self.chunk_bytes)
        with _quiet():
            if name in ACTIVATIONS:
                compressors = CODECS[self.codec]()
            else:  # token ids, mask, offsets, scales: small; zstd suits them whatever the codec
                compressors = [ZstdCodec(level=3)]
            return self._group.create_array(
                name,
                shape=shape,
                chunks=(rows, *shape[1:]),
                dtype=dtype,
                compressors=[*compressors, Crc32cCodec()],
                fill_value=0,
                # Otherwise zarr skips chunks that equal the fill value, and verification
                # could not tell a legitimately all-zero chunk from a lost one.
                config={"write_empty_chunks": True},
            )

    def append(
        self,
        sample_id: str,
        input_ids: Any,
        loss_mask: Any,
        aux: torch.Tensor | np.ndarray,
        last: torch.Tensor | np.ndarray,
    ) -> None:
        """Add one sample: `aux` [T, A, H] and `last` [T, H] as bf16 tensors or uint16 arrays."""
        if self._group is None:
            raise RuntimeError("ShardWriter.append outside its `with` block")
        ids, mask = _as_numpy(input_ids), _as_numpy(loss_mask)
        aux_bits, last_bits = _activation_bits(aux, "aux"), _activation_bits(last, "last")
        t, a, h = len(ids), len(self.aux_layer_ids), self.hidden_size
        expected = {"input_ids": (t,), "loss_mask": (t,), "aux": (t, a, h), "last": (t, h)}
        actual = {"input_ids": ids, "loss_mask": mask, "aux": aux_bits, "last": last_bits}
        for name, shape in expected.items():
            if actual[name].shape != shape:
                found = actual[name].shape
                raise ValueError(f"{sample_id}: {name} has shape {found}, expected {shape}")
        if t == 0:
            raise ValueError(f"{sample_id}: empty sample")
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() > np.iinfo(np.int32).max:
            raise ValueError(f"{sample_id}: input_ids must be non-negative int32 token ids")
        if sample_id in self._seen:
            raise ValueError(f"duplicate sample id {sample_id!r}")
        if self.codec in LOSSY_CODECS:  # no fp8 code for them; all-ones exponent: inf or NaN
            for name in ACTIVATIONS:
                if np.any((actual[name] & 0x7F80) == 0x7F80):
                    raise ValueError(
                        f"{sample_id}: {name} holds inf or NaN, which fp8 cannot store"
                    )
        actual["input_ids"], actual["loss_mask"] = ids.astype(np.int32), mask.astype(bool)
        for name, column in self._columns.items():
            column.push(actual[name])
        self.sample_ids.append(str(sample_id))
        self._seen.add(str(sample_id))
        self.offsets.append(self.offsets[-1] + t)

    def _submit(self, write: Callable[..., None], *args: Any) -> None:
        """Run a chunk write now, or queue it on the encode threads."""
        if self._pool is None:
            write(*args)
            return
        while len(self._pending) >= 2 * self.encode_threads:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(write, *args))

    def drain(self) -> None:
        """Wait until every chunk queued so far is written; raises the first write's error."""
        while self._pending:
            self._pending.popleft().result()

    def __exit__(self, exc_type, exc, tb) -> None:
        atomic, self._atomic = self._atomic, None
        try:
            if exc_type is None:
                self._finish()
        except BaseException as error:
            exc_type, exc, tb = type(error), error, error.__traceback__
            raise
        finally:
            if self._pool is not None:  # no thread may write into the store once it is gone
                for future in self._pending:
                    future.cancel()
                self._pool.shutdown(wait=True)
                self._pool, self._pending = None, deque()
            atomic.__exit__(exc_type, exc, tb)
            self._group = None
        if exc_type is None:
            write_manifest(self.path, self._manifest)

    def _finish(self) -> None:
        for column in self._columns.values():
            column.close()
        self.drain()
        for column in self._columns.values():
            column.set_shape()
        offsets = self._create("offsets", (len(self.offsets),))
        offsets[:] = np.asarray(self.offsets, dtype=np.int64)
        # payload_bytes: what `status` would otherwise stat file by file at every call (~10^5
        # chunk files a shard at the reference scale, on a shared filesystem). One listing
        # serves it and the manifest (the attributes rewrite only the root zarr.json, which the
        # manifest rehashes).
        files = tree_files(self._tmp)
        root_json = self._tmp / "zarr.json"
        payload = sum(f.stat().st_size for f in files if f != root_json)
        self._group.update_attributes(
            {
                "format_version": FORMAT_VERSION,
                "aux_layer_ids": self.aux_layer_ids,
                "last_layer_id": self.last_layer_id,
                "logical_dtype": LOGICAL_DTYPE,
                "hidden_size": self.hidden_size,
                "num_samples": self.num_samples,
                "num_tokens": self.num_tokens,
                "payload_bytes": payload,  # every file of the store but this zarr.json
                "sample_ids": self.sample_ids,
                "codec": self.codec,
                "lossy": self.codec in LOSSY_CODECS,
                **({"encoding": LOSSY_CODECS[self.codec]} if self.codec in LOSSY_CODECS else {}),
                **self.attrs,
            }
        )
        self._manifest = file_digests(self._tmp, self._digests, files)
