"""Extraction status, disk projection, preflight and verify on real zarr shards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from eagleflow.files import write_json, write_jsonl
from eagleflow.logs import InputError
from eagleflow.shards import ShardWriter, raw_bytes_per_token
from eagleflow.status import extraction_status, preflight
from eagleflow.verify import main as verify_main
from eagleflow.verify import verify_results

HIDDEN, AUX = 64, 3


def fake_results(root: Path, shard_lengths: list[list[int]], done: int) -> Path:
    """A results/ tree: a plan, prepared tokens for every shard, hidden shards for `done`."""
    results = root / "results"
    shards = []
    generator = torch.Generator().manual_seed(0)
    for index, lengths in enumerate(shard_lengths):
        name = f"{index:05d}"
        samples = [
            {
                "id": f"s{index}-{i}",
                "input_ids": list(range(n)),
                "loss_mask": [1] * n,
                "num_tokens": n,
            }
            for i, n in enumerate(lengths)
        ]
        write_jsonl(results / "tokens" / f"shard-{name}.jsonl", samples)
        shards.append({"shard": name, "samples": len(lengths), "estimated_tokens": 999})
        if index >= done:
            continue
        with ShardWriter(
            results / "hidden" / f"shard-{name}.zarr",
            aux_layer_ids=[2, 4, 5],
            last_layer_id=8,
            hidden_size=HIDDEN,
            attrs={},
        ) as writer:
            for sample in samples:
                n = sample["num_tokens"]
                # Heavy-tailed, like activations, so compression is neither 1x nor huge.
                states = torch.randn(n, AUX + 1, HIDDEN, generator=generator) ** 3
                writer.append(sample["id"], sample["input_ids"], sample["loss_mask"],
                              states[:, :AUX].bfloat16(), states[:, AUX].bfloat16())  # fmt: skip
    write_json(results / "plan" / "plan.json", {"shards": shards})
    return results


def test_projection_from_a_tenth_of_the_shards_matches_the_final_size(tmp_path: Path) -> None:
    lengths = [[150 + (7 * i + 13 * s) % 90 for i in range(12)] for s in range(10)]
    partial = extraction_status(
        fake_results(tmp_path / "a", lengths, done=1), num_aux=AUX, hidden_size=HIDDEN
    )
    final = extraction_status(
        fake_results(tmp_path / "b", lengths, done=10), num_aux=AUX, hidden_size=HIDDEN
    )
    assert partial.tokens_total_exact and partial.tokens_total == final.tokens_done
    assert partial.shards_done == 1 and final.shards_done == 10
    error = partial.projected_bytes / final.stored_bytes - 1
    print(f"projected {partial.projected_bytes} vs actual {final.stored_bytes}: {error:+.2%}")
    assert abs(error) < 0.02
    assert final.raw_bytes_done == final.tokens_done * raw_bytes_per_token(AUX, HIDDEN)


def test_stored_bytes_of_finished_stores_without_listing_their_chunks(
    tmp_path: Path, monkeypatch
) -> None:
    """A finished store's size comes from its attributes, exact to the byte, without a stat per
    chunk file (~10^5 a shard at the reference scale); a store without the attribute (written
    before it existed) and a store still being written are measured file by file."""
    results = fake_results(tmp_path, [[120] * 6] * 3, done=2)
    hidden = results / "hidden"
    on_disk = {
        store.name: sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        for store in hidden.glob("shard-*.zarr")
    }
    status = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    assert status.stored_bytes == sum(on_disk.values())

    listed = []
    real_rglob = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, p: listed.append(self) or real_rglob(self, p))
    again = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    assert (again.stored_bytes, again.projected_bytes) == (
        status.stored_bytes,
        status.projected_bytes,
    )
    assert listed == []

    older = hidden / "shard-00001.zarr" / "zarr.json"
    metadata = json.loads(older.read_text())
    del metadata["attributes"]["payload_bytes"]
    older.write_text(json.dumps(metadata))
    (hidden / ".tmp-shard-00002.zarr").mkdir()
    (hidden / ".tmp-shard-00002.zarr" / "c0").write_bytes(b"x" * 1000)
    again = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    assert sorted(p.name for p in listed) == [".tmp-shard-00002.zarr", "shard-00001.zarr"]
    on_disk["shard-00001.zarr"] = sum(
        f.stat().st_size for f in older.parent.rglob("*") if f.is_file()
    )
    assert again.stored_bytes == sum(on_disk.values())
    assert again.remaining_bytes == again.projected_bytes - again.stored_bytes - 1000


def test_projection_before_any_shard_knows_the_codec(tmp_path: Path) -> None:
    """With nothing measured yet the projection assumes no compression: raw bf16 for a
    lossless codec, a byte per value (plus ids and mask) for fp8 codes."""
    results = fake_results(tmp_path, [[100] * 4] * 2, done=0)
    lossless = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    fp8 = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN, codec="fp8-e4m3")
    tokens = 800
    assert lossless.projected_bytes == tokens * raw_bytes_per_token(AUX, HIDDEN)
    assert fp8.projected_bytes == pytest.approx(
        tokens * raw_bytes_per_token(AUX, HIDDEN, value_bytes=1), abs=1
    )


def test_preflight_refuses_and_says_by_how_much(tmp_path: Path, monkeypatch) -> None:
    results = fake_results(tmp_path, [[100] * 4] * 4, done=1)
    monkeypatch.setenv("EAGLEFLOW_FREE_BYTES", "1000")
    status = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    with pytest.raises(InputError, match=r"not enough disk .* short by [\d.]+ [KM]B"):
        preflight(status, margin_bytes=0)
    monkeypatch.setenv("EAGLEFLOW_FREE_BYTES", str(10**12))
    preflight(extraction_status(results, num_aux=AUX, hidden_size=HIDDEN), margin_bytes=10**9)


def test_verify_names_the_corrupt_and_missing_shards_and_the_repair_command(
    tmp_path: Path, capsys
) -> None:
    results = fake_results(tmp_path, [[300] * 3] * 4, done=4)
    assert verify_results(results) == {}
    chunk = sorted((results / "hidden/shard-00001.zarr/aux/c").rglob("*"))[-1]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    os.rename(results / "hidden/shard-00003.zarr", tmp_path / "elsewhere.zarr")
    report = verify_results(results)
    assert sorted(report) == ["00001", "00003"]
    assert "checksum" in " ".join(report["00001"])
    assert report["00003"] == [f"{results}/hidden/shard-00003.zarr: missing"]
    assert verify_main(["--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert (
        f"python -m eagleflow.repair {results}/hidden/shard-00001.zarr "
        f"{results}/hidden/shard-00003.zarr"
    ) in out


def test_verify_checks_the_metadata_and_the_manifest(tmp_path: Path) -> None:
    """No chunk checksum covers the metadata: a flipped layer id (same length, shapes intact)
    and a store whose manifest was never written (a crash between the two) are named."""
    results = fake_results(tmp_path, [[80] * 2] * 3, done=3)
    metadata = results / "hidden/shard-00000.zarr/zarr.json"
    metadata.write_text(
        metadata.read_text().replace('"aux_layer_ids": [\n      2,', '"aux_layer_ids": [\n      3,')
    )
    assert '"aux_layer_ids": [\n      3,' in metadata.read_text()
    (results / "hidden/shard-00002.sha256").unlink()
    report = verify_results(results)
    assert report == {
        "00000": [f"{metadata}: differs from {results}/hidden/shard-00000.sha256"],
        "00002": [
            f"{results}/hidden/shard-00002.sha256: missing (written once the shard is complete)"
        ],
    }


def test_verify_checks_samples_against_prepared_tokens(tmp_path: Path) -> None:
    results = fake_results(tmp_path, [[50, 60]], done=1)
    tokens = results / "tokens/shard-00000.jsonl"
    rows = [json.loads(line) for line in tokens.read_text().splitlines()]
    rows[1]["id"] = "other"
    write_jsonl(tokens, rows)
    assert "sample ids differ" in verify_results(results)["00000"][0]


def test_long_jobs_log_their_progress_and_status_eta_passes_a_day(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The bar is on stderr; its line (done/total, tokens/s, ETA) also reaches the job's log
    every LOG_EVERY_S, and the status ETA counts days rather than rolling over at 24 h."""
    from eagleflow import progress as progress_module
    from eagleflow.status import human_seconds

    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="eagleflow.progress"):
        with progress_module.token_progress(4, "extract (test)") as bar:
            bar.advance(1, 100)
    assert "extract (test)" in caplog.text and "1/4" in caplog.text and "tok_s" in caplog.text
    assert human_seconds(30 * 3600 + 61) == "1d 06:01:01"
    assert human_seconds(59) == "00:00:59"


def test_a_killed_repair_rerun_compares_with_what_the_workflow_consumed(tmp_path: Path) -> None:
    """The repair's snapshot (modification time and manifest of each shard it regenerates)
    outlives a repair killed after the shard was rewritten: run again, it still restores the
    time the workflow saw, not the regenerated shard's."""
    from eagleflow.repair import journal_path, snapshots

    results = fake_results(tmp_path, [[40] * 2], done=1)
    store = str(results / "hidden/shard-00000.zarr")
    os.utime(store, (1_000_000, 1_000_000))
    journal = journal_path([store])
    first = snapshots([store], journal)
    assert first[store].mtime == 1_000_000 and journal.is_file()
    os.utime(store)  # the killed repair had regenerated it: a new time
    again = snapshots([store], journal)
    assert again == first


def test_eta_from_the_first_shards_job_before_two_have_finished(tmp_path: Path) -> None:
    """A run of a few long jobs (the Kimi plan: 5 shards) had no ETA until two shards were
    done: with one, the speed is its job's (its benchmark row), and the status says so."""
    from eagleflow.status import format_status

    results = fake_results(tmp_path, [[100] * 4] * 5, done=1)
    status = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    assert status.tokens_per_s is None and status.eta_s is None
    row = results / "benchmarks/extract/shard-00000.tsv"
    row.parent.mkdir(parents=True)
    row.write_text("s\th:m:s\tmax_rss\n20.0\t0:00:20\t100\n")
    status = extraction_status(results, num_aux=AUX, hidden_size=HIDDEN)
    assert status.tokens_per_s == 20.0 and status.eta_s == 80  # 1,600 tokens left at 20 tok/s
    assert "20 tok/s (one job's benchmark; jobs side by side finish sooner), ETA 00:01:20" in (
        format_status(status)
    )
