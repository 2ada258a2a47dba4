"""The hidden-state shard format: the one package that knows it (write, open, verify, codecs).

A shard is a zarr v3 group directory (`…/shard-NNNNN.zarr`) holding its samples concatenated
along the token axis, without padding:

    aux        uint16 [T, A, H]   bf16 bit patterns of the aux layers (ids `aux_layer_ids`)
    last       uint16 [T, H]      bf16 bit patterns of layer `last_layer_id`, before the final norm
    input_ids  int32  [T]
    loss_mask  bool   [T]
    offsets    int64  [S+1]       sample i is rows offsets[i]:offsets[i+1]

bf16 is not a zarr dtype, so activations are stored as their uint16 views (never through fp16,
which is not bit-exact); the group attributes record `logical_dtype: "bfloat16"`. Every chunk
ends in a crc32c checksum, so a corrupt chunk fails loudly on read. Chunks run along the token
axis only and hold about `chunk_bytes` of raw data each.

Next to the store, the writer leaves its manifest (`shard-NNNNN.sha256`, `eagleflow.manifest`).

Modules, each importing only those listed before it:

    format   array names and dtypes, attributes, codecs, bf16 bit patterns, bytes per token
    fp8      the lossy fp8-e4m3 quantization of activation chunks
    chunks   chunk files encoded/decoded without zarr (`_ChunkFiles`), the decoded-chunk cache
    columns  token-axis arrays being written in whole, aligned chunks
    writer   `ShardWriter` and its encode threads
    reader   `Shard`, `open_shard`, row readers
    verify   `verify_shard`
"""

from eagleflow.shards.chunks import ChunkCache, _ChunkFiles, _Shuffle2
from eagleflow.shards.format import (
    ACTIVATIONS,
    ARRAY_DTYPES,
    CODECS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CODEC,
    FORMAT_ATTRS,
    FORMAT_VERSION,
    LOGICAL_DTYPE,
    LOSSY_CODECS,
    SCALE_SUFFIX,
    TOKEN_ARRAYS,
    TOKEN_OVERHEAD_BYTES,
    WRITER_ATTRS,
    bf16_to_uint16,
    raw_bytes_per_token,
    stored_arrays,
    uint16_to_bf16,
)
from eagleflow.shards.reader import Shard, open_shard
from eagleflow.shards.verify import verify_shard
from eagleflow.shards.writer import ShardWriter

__all__ = [
    "ACTIVATIONS",
    "ARRAY_DTYPES",
    "CODECS",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CODEC",
    "FORMAT_ATTRS",
    "FORMAT_VERSION",
    "LOGICAL_DTYPE",
    "LOSSY_CODECS",
    "SCALE_SUFFIX",
    "TOKEN_ARRAYS",
    "TOKEN_OVERHEAD_BYTES",
    "WRITER_ATTRS",
    "ChunkCache",
    "Shard",
    "ShardWriter",
    "_ChunkFiles",
    "_Shuffle2",
    "bf16_to_uint16",
    "open_shard",
    "raw_bytes_per_token",
    "stored_arrays",
    "uint16_to_bf16",
    "verify_shard",
]
