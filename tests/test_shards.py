"""The hidden-state shard format: bit-exact round trips, determinism, atomicity, verification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from eagleflow.manifest import store_checksums
from eagleflow.shards import (
    CODECS,
    LOSSY_CODECS,
    TOKEN_ARRAYS,
    ShardWriter,
    bf16_to_uint16,
    open_shard,
    uint16_to_bf16,
    verify_shard,
)

LOSSLESS = sorted(set(CODECS) - set(LOSSY_CODECS))  # tests/test_fp8.py covers the lossy one
A, H = 3, 16
AUX_IDS, LAST_ID = [2, 4, 5], 8
CHUNK_BYTES = 1000  # aux: 10 rows a chunk, last: 31, input_ids: 250, loss_mask: 1000
ATTRS = {"target_fingerprint": "sha256:abc", "backend": "test", "backend_version": "0"}
# bf16 bit patterns that a float16 round trip would destroy or that are easy to mishandle.
SPECIAL_BITS = [
    0x7FC0, 0xFFC0, 0x7F81, 0xFFFF,  # NaNs, with payloads and sign
    0x7F80, 0xFF80,  # +-inf
    0x0001, 0x8001, 0x007F,  # denormals
    0x8000, 0x0000,  # -0, +0
    0x7F7F, 0xFF7F,  # largest finite
    0x477F, 0x4780, 0x4790,  # 65280, 65536, 73728: around float16's 65504 limit
]  # fmt: skip


def make_samples(n: int = 12, seed: int = 0) -> list[dict]:
    """Ragged samples whose activations take arbitrary bit patterns, specials included."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        t = int(rng.integers(1, 40))
        aux = rng.integers(0, 2**16, size=(t, A, H), dtype=np.uint16)
        last = rng.integers(0, 2**16, size=(t, H), dtype=np.uint16)
        aux.reshape(-1)[: len(SPECIAL_BITS)] = SPECIAL_BITS[: aux.size]
        last.reshape(-1)[-len(SPECIAL_BITS) :] = SPECIAL_BITS[-last.size :]
        samples.append(
            {
                "sample_id": f"prompt-{i:03d}",
                "input_ids": torch.from_numpy(rng.integers(0, 5000, size=t)),
                "loss_mask": torch.from_numpy(rng.random(t) < 0.6),
                "aux": uint16_to_bf16(aux),
                "last": uint16_to_bf16(last),
            }
        )
    # One sample longer than several chunks of every activation array.
    big = samples[3]
    t = 75
    big["input_ids"] = torch.arange(t)
    big["loss_mask"] = torch.ones(t, dtype=torch.bool)
    big["aux"] = torch.randn(t, A, H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    big["last"] = torch.zeros(t, H, dtype=torch.bfloat16)  # all fill value: must still be stored
    return samples


def write(path: Path, samples: list[dict], **kwargs) -> Path:
    options = {"chunk_bytes": CHUNK_BYTES, **kwargs}
    with ShardWriter(
        path, aux_layer_ids=AUX_IDS, last_layer_id=LAST_ID, hidden_size=H, attrs=ATTRS, **options
    ) as writer:
        for sample in samples:
            writer.append(**sample)
    return path


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint16)


def assert_same_sample(got: dict, want: dict) -> None:
    assert got["sample_id"] == want["sample_id"]
    assert torch.equal(got["input_ids"], want["input_ids"].long())
    assert torch.equal(got["loss_mask"], want["loss_mask"])
    assert got["aux"].dtype == got["last"].dtype == torch.bfloat16
    assert torch.equal(bits(got["aux"]), bits(want["aux"]))
    assert torch.equal(bits(got["last"]), bits(want["last"]))


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return make_samples()


@pytest.fixture(scope="module")
def clean_shard(tmp_path_factory: pytest.TempPathFactory, samples: list[dict]) -> Path:
    return write(tmp_path_factory.mktemp("clean") / "shard-00000.zarr", samples)


def test_bf16_uint16_conversion_is_bit_exact_for_every_pattern() -> None:
    every = np.arange(2**16, dtype=np.uint16)
    as_bf16 = uint16_to_bf16(every)
    assert as_bf16.dtype == torch.bfloat16
    assert np.array_equal(bf16_to_uint16(as_bf16), every)
    values = torch.tensor([65504.0, 70000.0, float("inf"), 1e-40]).bfloat16()
    assert np.array_equal(uint16_to_bf16(bf16_to_uint16(values)).float(), values.float())
    with pytest.raises(TypeError):
        bf16_to_uint16(torch.zeros(2, dtype=torch.float16))


def test_round_trip_is_bit_exact(clean_shard: Path, samples: list[dict]) -> None:
    shard = open_shard(clean_shard)
    assert shard.num_samples == len(samples) == len(shard)
    assert shard.num_tokens == sum(len(s["input_ids"]) for s in samples)
    assert shard.sample_ids == [s["sample_id"] for s in samples]
    assert shard.attrs["aux_layer_ids"] == AUX_IDS and shard.attrs["last_layer_id"] == LAST_ID
    assert shard.attrs["logical_dtype"] == "bfloat16" and shard.attrs["hidden_size"] == H
    assert shard.attrs["target_fingerprint"] == "sha256:abc"
    for got, want in zip(shard.iter_samples(), samples, strict=True):
        assert_same_sample(got, want)
    for i in [7, 0, 11, 3, 3]:  # random access too
        assert_same_sample(shard.sample(i), samples[i])
    for got, want in zip(shard.iter_samples(4, 9), samples[4:9], strict=True):
        assert_same_sample(got, want)
    with pytest.raises(IndexError):
        shard.sample(len(samples))


def test_editing_a_sample_in_place_does_not_alter_later_reads(tmp_path: Path) -> None:
    short = [
        {k: v[:3] if k != "sample_id" else v for k, v in sample.items()}
        for sample in make_samples(8, seed=3)
    ]  # several samples per chunk, so that repeated reads come from the chunk cache
    shard = open_shard(write(tmp_path / "shard-00000.zarr", short))
    for i in [0, 0, 1, 1, 1, 5, 5]:
        got = shard.sample(i)
        assert_same_sample(got, short[i])
        got["aux"].zero_()
        got["last"].fill_(1.0)


def test_numpy_input_writes_the_same_bytes(tmp_path: Path, samples: list[dict]) -> None:
    as_numpy = [
        {
            **s,
            "input_ids": s["input_ids"].numpy(),
            "aux": bf16_to_uint16(s["aux"]),
            "last": bf16_to_uint16(s["last"]),
        }
        for s in samples
    ]
    first = write(tmp_path / "a" / "shard-00000.zarr", samples)
    second = write(tmp_path / "b" / "shard-00000.zarr", as_numpy)
    assert store_checksums(first) == store_checksums(second)


def test_consecutive_samples_decode_each_chunk_once(clean_shard: Path) -> None:
    shard = open_shard(clean_shard)
    rows_read = dict.fromkeys(TOKEN_ARRAYS, 0)
    for name, reader in shard._readers.items():

        def counting(index, decode=reader._decode, name=name):
            block = decode(index)
            rows_read[name] += len(block)
            return block

        reader._decode = counting
    for _ in shard.iter_samples():
        pass
    assert rows_read == dict.fromkeys(TOKEN_ARRAYS, shard.num_tokens)


@pytest.mark.parametrize("codec", LOSSLESS)
def test_chunk_files_are_zarrs_own_bytes(tmp_path: Path, codec: str) -> None:
    """Chunks written and read outside zarr's pipeline (the fast path) are exactly zarr's."""
    path = write(tmp_path / "shard-00000.zarr", make_samples(4, seed=2), codec=codec)
    shard = open_shard(path)
    fast = {name: reader.files is not None for name, reader in shard._readers.items()}
    # The fast path covers every chain but blosc's; token ids and masks always take it.
    assert fast == {name: name in ("input_ids", "loss_mask") or "blosc" not in codec
                    for name in TOKEN_ARRAYS}  # fmt: skip
    for name in TOKEN_ARRAYS:
        original = shard.arrays[name]
        again = zarr.create_array(
            tmp_path / "again" / name,
            shape=original.shape,
            chunks=original.chunks,
            dtype=original.dtype,
            compressors=original.compressors,
            fill_value=0,
            config={"write_empty_chunks": True},
        )
        again[:] = original[:]
        chunks = sorted(p.relative_to(path / name) for p in (path / name / "c").rglob("*")
                        if p.is_file())  # fmt: skip
        assert len(chunks) == original.nchunks
        for chunk in chunks:
            assert (path / name / chunk).read_bytes() == (
                tmp_path / "again" / name / chunk
            ).read_bytes()
        assert np.array_equal(shard._readers[name].read(0, original.shape[0]), original[:])


def test_reading_a_corrupt_chunk_names_the_file(clean_shard: Path, tmp_path: Path) -> None:
    path = shutil.copytree(clean_shard, tmp_path / "shard-00000.zarr")
    last_chunk = open_shard(path).arrays["aux"].nchunks - 1
    chunk = path / "aux" / "c" / str(last_chunk) / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    shard = open_shard(path)
    shard.sample(0)  # in intact chunks
    with pytest.raises(ValueError, match=rf"aux/c/{last_chunk}/0/0: crc32c checksum mismatch"):
        list(shard.iter_samples())
    chunk.write_bytes(b"")  # the crc32c of nothing is an empty checksum's 0
    with pytest.raises(ValueError, match=rf"aux/c/{last_chunk}/0/0: crc32c checksum mismatch"):
        list(open_shard(path).iter_samples())
    chunk.unlink()
    with pytest.raises(FileNotFoundError, match=rf"aux/c/{last_chunk}/0/0: chunk file missing"):
        list(open_shard(path).iter_samples())


@pytest.mark.parametrize("codec", LOSSLESS)
def test_every_codec_round_trips(tmp_path: Path, codec: str) -> None:
    samples = make_samples(4, seed=1)
    path = write(tmp_path / "shard-00000.zarr", samples, codec=codec)
    assert verify_shard(path) == []
    shard = open_shard(path)
    assert shard.attrs["codec"] == codec
    for got, want in zip(shard.iter_samples(), samples, strict=True):
        assert_same_sample(got, want)


def test_sizes(clean_shard: Path) -> None:
    shard = open_shard(clean_shard)
    t, s = shard.num_tokens, shard.num_samples
    assert shard.nbytes_raw() == t * (A * H * 2 + H * 2 + 4 + 1) + (s + 1) * 8
    assert shard.nbytes_raw(("aux",)) == t * A * H * 2
    stored = shard.nbytes_stored(("aux", "last"))
    assert 0 < stored < shard.nbytes_stored()


def test_writing_twice_gives_identical_files(tmp_path: Path, samples: list[dict]) -> None:
    first = write(tmp_path / "a" / "shard-00000.zarr", samples)
    second = write(tmp_path / "b" / "shard-00000.zarr", samples)
    sums = store_checksums(first)
    assert sums == store_checksums(second)
    assert "zarr.json" in sums and "aux/c/0/0/0" in sums


@pytest.mark.parametrize("idle", [False, True], ids=["normal-priority", "idle-priority"])
def test_encode_threads_write_the_same_bytes(
    tmp_path: Path, samples: list[dict], idle: bool
) -> None:
    serial = write(tmp_path / "a" / "shard-00000.zarr", samples)
    threaded = write(
        tmp_path / "b" / "shard-00000.zarr", samples, encode_threads=3, encode_idle=idle
    )
    assert store_checksums(threaded) == store_checksums(serial)
    assert verify_shard(threaded) == []


def test_a_failed_chunk_write_on_an_encode_thread_leaves_no_shard(
    tmp_path: Path, samples: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagleflow import shards

    real_write = shards._ChunkFiles.write

    def disk_full(self, index: int, rows: np.ndarray) -> None:
        if index == 2:
            raise OSError(28, "No space left on device")
        real_write(self, index, rows)

    monkeypatch.setattr(shards._ChunkFiles, "write", disk_full)
    final = tmp_path / "shard-00000.zarr"
    with pytest.raises(OSError, match="No space left"):
        write(final, samples, encode_threads=2)
    assert not final.exists() and not (tmp_path / ".tmp-shard-00000.zarr").exists()


def test_exception_leaves_no_shard_and_a_later_write_succeeds(
    tmp_path: Path, samples: list[dict]
) -> None:
    final = tmp_path / "shard-00003.zarr"
    tmp = tmp_path / ".tmp-shard-00003.zarr"
    with pytest.raises(RuntimeError, match="extraction died"):
        with ShardWriter(
            final, aux_layer_ids=AUX_IDS, last_layer_id=LAST_ID, hidden_size=H, attrs=ATTRS
        ) as writer:
            writer.append(**samples[0])
            raise RuntimeError("extraction died")
    assert not final.exists() and not tmp.exists()

    (tmp / "aux").mkdir(parents=True)  # a stale leftover of a killed job
    (tmp / "aux" / "junk").write_bytes(b"junk")
    write(final, samples)
    assert not tmp.exists()
    assert verify_shard(final) == []
    assert not (final / "aux" / "junk").exists()


def test_bad_appends_are_refused(tmp_path: Path, samples: list[dict]) -> None:
    sample = samples[0]
    with pytest.raises(ValueError, match="format attributes"):
        ShardWriter(
            tmp_path / "x.zarr",
            aux_layer_ids=AUX_IDS,
            last_layer_id=LAST_ID,
            hidden_size=H,
            attrs={"num_tokens": 3},
        )
    with pytest.raises(ValueError, match="unknown codec"):
        write(tmp_path / "x.zarr", [], codec="gzip-9")
    with pytest.raises(ValueError, match="aux has shape"):
        write(tmp_path / "x.zarr", [{**sample, "aux": sample["aux"][:, :2]}])
    with pytest.raises(ValueError, match="duplicate"):
        write(tmp_path / "x.zarr", [sample, sample])
    with pytest.raises(TypeError):
        write(tmp_path / "x.zarr", [{**sample, "last": sample["last"].float()}])
    assert not (tmp_path / "x.zarr").exists()


def test_writer_buffers_at_most_one_chunk_and_streams(tmp_path: Path) -> None:
    samples = make_samples(30, seed=2)
    path = tmp_path / "shard-00000.zarr"
    with ShardWriter(
        path,
        aux_layer_ids=AUX_IDS,
        last_layer_id=LAST_ID,
        hidden_size=H,
        attrs=ATTRS,
        chunk_bytes=CHUNK_BYTES,
    ) as writer:
        for sample in samples:
            writer.append(**sample)
            for column in writer._columns.values():
                assert len(column.buffer) == column.array.chunks[0]
                assert column.fill < column.rows
                assert column.written + column.fill == writer.num_tokens
        chunk_files = list((tmp_path / ".tmp-shard-00000.zarr" / "aux" / "c").rglob("*"))
        assert len(chunk_files) >= writer.num_tokens // writer._columns["aux"].rows
    assert verify_shard(path) == []


# --- verification: each kind of damage is reported, naming the shard and the array ---------


def damaged(clean: Path, tmp_path: Path) -> Path:
    copy = tmp_path / clean.name
    shutil.copytree(clean, copy)
    return copy


def edit_attrs(path: Path, **changes) -> None:
    meta_path = path / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"].update(changes)
    meta_path.write_text(json.dumps(meta))


def test_verify_accepts_a_clean_shard(clean_shard: Path) -> None:
    assert verify_shard(clean_shard) == []


def test_verify_reports_flipped_bytes(clean_shard: Path, tmp_path: Path) -> None:
    path = damaged(clean_shard, tmp_path)
    chunk = path / "aux" / "c" / "2" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x5A
    chunk.write_bytes(bytes(data))
    problems = verify_shard(path)
    assert len(problems) == 1
    assert str(path) in problems[0] and "aux" in problems[0] and "row 20" in problems[0]


def test_verify_reports_a_truncated_chunk(clean_shard: Path, tmp_path: Path) -> None:
    path = damaged(clean_shard, tmp_path)
    chunk = path / "last" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    problems = verify_shard(path)
    assert len(problems) == 1 and "last" in problems[0] and str(path) in problems[0]


@pytest.mark.parametrize("chunk", ["aux/c/1/0/0", "input_ids/c/0", "offsets/c/0"])
def test_verify_reports_a_missing_chunk(clean_shard: Path, tmp_path: Path, chunk: str) -> None:
    path = damaged(clean_shard, tmp_path)
    (path / chunk).unlink()
    problems = verify_shard(path)
    name = chunk.split("/")[0]
    assert any(f"{name}: 1 chunk file(s) missing" in p and str(path) in p for p in problems)


@pytest.mark.parametrize("removed", ["offsets", "zarr.json", "aux/zarr.json"])
def test_verify_reports_missing_metadata(clean_shard: Path, tmp_path: Path, removed: str) -> None:
    path = damaged(clean_shard, tmp_path)
    target = path / removed
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    problems = verify_shard(path)
    assert problems and all(str(path) in p for p in problems)


@pytest.mark.parametrize(
    "changes",
    [
        {"num_tokens": 1},
        {"num_samples": 3},
        {"sample_ids": ["only-one"]},
        {"hidden_size": H * 2},
        {"aux_layer_ids": [2, 4]},
        {"logical_dtype": "float16"},
        {"format_version": 99},
        {"aux_layer_ids": None},
    ],
)
def test_verify_reports_inconsistent_attributes(
    clean_shard: Path, tmp_path: Path, changes: dict
) -> None:
    path = damaged(clean_shard, tmp_path)
    edit_attrs(path, **changes)
    problems = verify_shard(path)
    assert problems and all(str(path) in p for p in problems)


def test_verify_reports_a_missing_attribute(clean_shard: Path, tmp_path: Path) -> None:
    path = damaged(clean_shard, tmp_path)
    meta = json.loads((path / "zarr.json").read_text())
    del meta["attributes"]["sample_ids"]
    (path / "zarr.json").write_text(json.dumps(meta))
    assert verify_shard(path) == [f"{path}: attribute 'sample_ids' missing"]


def test_verify_reports_decreasing_offsets(clean_shard: Path, tmp_path: Path) -> None:
    path = damaged(clean_shard, tmp_path)
    offsets = zarr.open_array(path / "offsets", mode="r+")
    offsets[2] = offsets[1] - 1
    problems = verify_shard(path)
    assert len(problems) == 1 and "offsets" in problems[0]


def test_verify_reports_a_missing_store(tmp_path: Path) -> None:
    problems = verify_shard(tmp_path / "shard-00009.zarr")
    assert problems == [f"{tmp_path / 'shard-00009.zarr'}: shard store missing"]
