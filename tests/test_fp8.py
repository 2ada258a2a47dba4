"""Lossy fp8 storage (`extract.codec: fp8-e4m3`): error bounds, streaming determinism,
verification and refusal of values it cannot store."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from eagleflow.manifest import store_checksums
from eagleflow.shards import ShardWriter, open_shard, verify_shard
from eagleflow.shards.fp8 import E4M3_MAX, dequantize, quantize

A, H = 3, 32
CHUNK_BYTES = 4000  # aux: 20 rows a chunk, last: 62


def activations(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual-stream-like bf16 states: channel scales spread over 3 decades, one massive
    channel (~1e4x), and a first token carrying an outlier, as real LLMs have."""
    g = torch.Generator().manual_seed(seed)
    scales = 10 ** (torch.rand(H, generator=g) * 3 - 1)
    aux = torch.randn(t, A, H, generator=g) * scales
    aux[:, :, 7] *= 1e4
    aux[0, :, 3] = 3e3
    last = torch.randn(t, H, generator=g) * scales
    return aux.bfloat16(), last.bfloat16()


def samples(n: int = 7) -> list[dict]:
    out = []
    for i in range(n):
        t = 5 + 13 * i
        aux, last = activations(t, seed=i)
        out.append(
            {"sample_id": f"s{i}", "input_ids": np.arange(t), "loss_mask": np.ones(t, bool),
             "aux": aux, "last": last}
        )  # fmt: skip
    return out


def write(path: Path, rows: list[dict], **options) -> Path:
    with ShardWriter(
        path, aux_layer_ids=[2, 4, 5], last_layer_id=8, hidden_size=H, attrs={},
        codec="fp8-e4m3", chunk_bytes=CHUNK_BYTES, **options,
    ) as writer:  # fmt: skip
        for row in rows:
            writer.append(**row)
    return path


def test_quantize_is_within_e4m3s_rounding_of_every_value() -> None:
    aux, _ = activations(200, seed=0)
    bits = aux.view(torch.uint16).numpy()
    codes, scale = quantize(bits)
    assert codes.dtype == np.uint8 and scale.shape == (A, H)
    assert np.allclose(np.abs(aux.float().numpy()).max(axis=0) / E4M3_MAX, scale)
    decoded = torch.from_numpy(dequantize(codes, scale)).view(torch.bfloat16).float()
    x = aux.float()
    # 3 mantissa bits: half an ulp is 2^-4 relative for normals; below e4m3's smallest normal
    # (2^-6 of the scale unit) the step is absolute, 2^-9 of it; plus bf16's own rounding.
    bound = torch.maximum(x.abs() * 2**-4, torch.from_numpy(scale) * 2**-10) * (1 + 2**-7)
    assert torch.all((decoded - x).abs() <= bound + 1e-30)
    relative = ((decoded - x).norm() / x.norm()).item()
    assert relative < 0.04


def test_fp8_shard_round_trips_within_bounds_and_reads_like_any_shard(tmp_path: Path) -> None:
    rows = samples()
    path = write(tmp_path / "shard-00000.zarr", rows)
    assert verify_shard(path) == []
    shard = open_shard(path)
    assert shard.attrs["codec"] == "fp8-e4m3" and shard.attrs["lossy"] is True
    assert "per channel" in shard.attrs["encoding"]
    assert shard.arrays["aux"].dtype == np.uint8 and shard.arrays["aux_scale"].dtype == np.float32
    assert shard.arrays["aux_scale"].shape == (shard.arrays["aux"].nchunks, A, H)
    for got, want in zip(shard.iter_samples(), rows, strict=True):
        assert got["aux"].dtype == torch.bfloat16 and got["aux"].shape == want["aux"].shape
        assert torch.equal(got["input_ids"], torch.from_numpy(want["input_ids"]).long())
        for name in ("aux", "last"):
            x, y = want[name].float(), got[name].float()
            assert ((y - x).norm() / x.norm()).item() < 0.04, name
    # Raw counts bf16 (what fp8 saves against); stored includes the scales.
    raw = shard.nbytes_raw(("aux", "last"))
    assert raw == shard.num_tokens * (A + 1) * H * 2
    scales = sum(shard.arrays[f"{n}_scale"].nbytes_stored() for n in ("aux", "last"))
    # Codes: a byte per value at most (chunk headers and checksums aside); scales on top.
    assert scales < shard.nbytes_stored(("aux", "last")) < 0.52 * raw + scales


def test_fp8_bytes_do_not_depend_on_threads_or_sample_split(tmp_path: Path) -> None:
    rows = samples()
    serial = write(tmp_path / "a" / "shard-00000.zarr", rows)
    threaded = write(tmp_path / "b" / "shard-00000.zarr", rows, encode_threads=2)
    assert store_checksums(serial) == store_checksums(threaded)


def test_verify_names_a_corrupt_or_missing_scale_chunk(tmp_path: Path) -> None:
    clean = write(tmp_path / "clean" / "shard-00000.zarr", samples())
    flipped = shutil.copytree(clean, tmp_path / "flipped" / "shard-00000.zarr")
    chunk = flipped / "aux_scale" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert any("aux_scale: chunk at row 1 unreadable" in p for p in verify_shard(flipped))
    with pytest.raises(ValueError, match="aux_scale/c/1/0/0: crc32c checksum mismatch"):
        list(open_shard(flipped).iter_samples())
    missing = shutil.copytree(clean, tmp_path / "missing" / "shard-00000.zarr")
    (missing / "last_scale" / "c" / "0" / "0").unlink()
    assert any("last_scale: 1 chunk file(s) missing" in p for p in verify_shard(missing))


def test_inf_or_nan_is_refused_naming_the_sample(tmp_path: Path) -> None:
    rows = samples(2)
    rows[1]["last"] = rows[1]["last"].clone()
    rows[1]["last"][3, 5] = float("inf")
    with pytest.raises(ValueError, match="s1: last holds inf or NaN"):
        write(tmp_path / "shard-00000.zarr", rows)
    assert not (tmp_path / "shard-00000.zarr").exists()
