"""Token-axis arrays being written: rows buffered into whole, aligned chunks, handed to an
encoder (`ShardWriter`'s encode threads, or the caller's thread)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr

from eagleflow.shards.chunks import _ChunkFiles
from eagleflow.shards.fp8 import quantize


def _rows_per_chunk(row_bytes: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // row_bytes)


class _Column:
    """One token-axis array being written: buffers at most one chunk of rows, writes full chunks.

    Chunks are written whole and aligned, so the bytes of every chunk depend only on the rows
    appended, not on how they were split into samples. Chunk files are written through
    `submit`, which may run them later on another thread: what is handed to it is never
    touched again here (a full buffer is replaced, rows from the caller are copied).
    """

    def __init__(
        self,
        array: zarr.Array,
        directory: Path,
        submit: Callable[..., None],
        pooled: bool,
        digests: dict[Path, str],
        dtype: str | np.dtype | None = None,
    ) -> None:
        self.array, self.submit, self.pooled = array, submit, pooled
        self.files = _ChunkFiles.for_array(array, directory, digests)
        self.rows = array.chunks[0]
        # Rows as appended (`dtype`; the array's own by default), before any encoding.
        self.buffer = np.empty((self.rows, *array.shape[1:]), dtype=dtype or array.dtype)
        self.fill = 0  # rows waiting in the buffer
        self.written = 0  # rows already in the array

    def push(self, data: np.ndarray) -> None:
        pos = 0
        if self.fill:
            pos = min(self.rows - self.fill, len(data))
            self.buffer[self.fill : self.fill + pos] = data[:pos]
            self.fill += pos
            if self.fill == self.rows:
                self._write(self.buffer)
                self.buffer, self.fill = np.empty_like(self.buffer), 0
        whole = (len(data) - pos) // self.rows * self.rows
        if whole:  # whole chunks go straight to the array
            block = data[pos : pos + whole]
            self._write(block.copy() if self.pooled else block)
            pos += whole
        rest = len(data) - pos
        self.buffer[self.fill : self.fill + rest] = data[pos:]
        self.fill += rest

    def close(self) -> None:
        """Write the last, partial chunk; the caller waits for the writes, then calls
        `set_shape`."""
        if self.fill:
            self._write(self.buffer[: self.fill])
            self.fill = 0

    def set_shape(self) -> None:
        if self.files is not None:  # chunk files written directly: set the shape once
            self.array.resize((self.written, *self.array.shape[1:]))

    def _write(self, block: np.ndarray) -> None:
        end = self.written + len(block)
        if self.files is None:  # through zarr, on this thread (codecs we do not encode)
            self.array.resize((end, *self.array.shape[1:]))
            self.array[self.written : end] = block
        else:
            first = self.written // self.rows  # whole chunks were written before this block
            for k in range(0, len(block), self.rows):
                self.submit(self._write_chunk, first + k // self.rows, block[k : k + self.rows])
        self.written = end

    def _write_chunk(self, index: int, rows: np.ndarray) -> None:
        self.files.write(index, rows)


class _Fp8Column(_Column):
    """An activation array stored as fp8 codes, with its scale array (one row per chunk);
    each chunk is quantized where it is encoded (on the encode threads, if any)."""

    def __init__(
        self,
        array: zarr.Array,
        scales: zarr.Array,
        directory: Path,
        submit: Callable[..., None],
        pooled: bool,
        digests: dict[Path, str],
    ) -> None:
        super().__init__(array, directory, submit, pooled, digests, dtype=np.uint16)
        self.scale_array = scales
        self.scale_files = _ChunkFiles.for_array(
            scales, directory.with_name(scales.basename), digests
        )
        if self.files is None or self.scale_files is None:
            raise ValueError(f"{array.name}: fp8 arrays must be chunked along the token axis only")

    def _write_chunk(self, index: int, rows: np.ndarray) -> None:
        codes, scale = quantize(rows)
        self.files.write(index, codes)
        self.scale_files.write(index, scale[np.newaxis])

    def set_shape(self) -> None:
        super().set_shape()
        chunks = -(-self.written // self.rows)
        self.scale_array.resize((chunks, *self.scale_array.shape[1:]))
