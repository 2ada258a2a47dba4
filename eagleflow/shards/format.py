"""The shard format itself: array names and dtypes, format attributes, codecs, bf16 bit patterns.

Every other module of the package (and anyone sizing a shard without opening one) takes these
facts from here. The layout is described in the package docstring (`eagleflow.shards`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.codecs.numcodecs import Shuffle
from zarr.errors import ZarrUserWarning

FORMAT_VERSION = 1
LOGICAL_DTYPE = "bfloat16"
DEFAULT_CODEC = "shuffle-zstd1"
DEFAULT_CHUNK_BYTES = 2 * 2**20

# Attributes the writer sets itself; the caller's `attrs` may not override them.
FORMAT_ATTRS = (
    "format_version",
    "aux_layer_ids",
    "last_layer_id",
    "logical_dtype",
    "hidden_size",
    "num_samples",
    "num_tokens",
    "sample_ids",
    "codec",
)
# Also set by the writer (not required of shards written before they existed).
WRITER_ATTRS = (*FORMAT_ATTRS, "lossy", "encoding", "payload_bytes")
# Arrays written sample by sample along the token axis, with their stored dtypes.
TOKEN_ARRAYS = {"aux": "uint16", "last": "uint16", "input_ids": "int32", "loss_mask": "bool"}
ARRAY_DTYPES = {**TOKEN_ARRAYS, "offsets": "int64"}

# Compressors (bytes-to-bytes codecs) of the activation arrays, by name; crc32c is always
# appended. The element size of every activation array is 2 bytes (bf16 bit patterns).
CODECS: dict[str, Callable[[], list]] = {
    "none": lambda: [],
    "zstd1": lambda: [ZstdCodec(level=1)],
    "zstd3": lambda: [ZstdCodec(level=3)],
    "shuffle-zstd1": lambda: [Shuffle(elementsize=2), ZstdCodec(level=1)],
    "shuffle-zstd3": lambda: [Shuffle(elementsize=2), ZstdCodec(level=3)],
    "blosc-zstd1-shuffle": lambda: [
        BloscCodec(cname="zstd", clevel=1, shuffle="shuffle", typesize=2)
    ],
    "blosc-zstd1-bitshuffle": lambda: [
        BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle", typesize=2)
    ],
    "blosc-lz4-shuffle": lambda: [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=2)],
    # Lossy (eagleflow.shards.fp8): the activations become uint8 e4m3 codes plus float32 scale
    # arrays.
    "fp8-e4m3": lambda: [ZstdCodec(level=1)],
}
LOSSY_CODECS = {"fp8-e4m3": "float8_e4m3fn codes, float32 scale per channel per chunk"}
ACTIVATIONS = ("aux", "last")
SCALE_SUFFIX = "_scale"  # `aux_scale`: the scales of `aux`, one row per chunk of it

# Bytes per token besides the activations: int32 id + uint8 loss mask.
TOKEN_OVERHEAD_BYTES = 5


def stored_arrays(codec: str) -> dict[str, str]:
    """The arrays a shard written with `codec` holds, with their stored dtypes."""
    if codec not in LOSSY_CODECS:
        return dict(ARRAY_DTYPES)
    fp8 = {name: "uint8" for name in ACTIVATIONS}
    scales = {name + SCALE_SUFFIX: "float32" for name in ACTIVATIONS}
    return {**ARRAY_DTYPES, **fp8, **scales}


def raw_bytes_per_token(num_aux: int, hidden_size: int, value_bytes: int = 2) -> int:
    """Uncompressed bytes one token takes in a shard: aux + last layer in bf16 (`value_bytes`
    per value: 1 for fp8 codes), id and mask."""
    return (num_aux + 1) * hidden_size * value_bytes + TOKEN_OVERHEAD_BYTES


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence zarr's warning that numcodecs codecs are outside the v3 spec (raised per open)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Numcodecs codecs", category=ZarrUserWarning)
        yield


def bf16_to_uint16(t: torch.Tensor) -> np.ndarray:
    """The bit patterns of a bf16 tensor as a uint16 numpy array (bit-exact, on the CPU)."""
    if t.dtype != torch.bfloat16:
        raise TypeError(f"expected a bfloat16 tensor, got {t.dtype}")
    return t.detach().cpu().contiguous().view(torch.uint16).numpy()


def uint16_to_bf16(a: np.ndarray) -> torch.Tensor:
    """The bf16 tensor whose bit patterns are the uint16 array `a` (bit-exact)."""
    if a.dtype != np.uint16:
        raise TypeError(f"expected a uint16 array, got {a.dtype}")
    return torch.from_numpy(np.ascontiguousarray(a)).view(torch.bfloat16)
