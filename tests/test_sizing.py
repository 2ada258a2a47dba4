"""The sizing guide: projections from a target's shape, its CLI checks, and a finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_status import AUX, HIDDEN, fake_results

from eagleflow.sizing import (
    DEFAULT_RATIO,
    DEFAULT_STORED_BYTES_PER_SHARD,
    PLAN_MAX_SAMPLES_PER_SHARD,
    main,
    project,
)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = ["--layers", "61", "--hidden", "7168", "--samples", "10000", "--mean-tokens", "1740"]


def run_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_fp8_codec_halves_the_assumed_size_and_goes_into_the_config(
    capsys: pytest.CaptureFixture,
) -> None:
    sizing = run_json(capsys, *REFERENCE, "--codec", "fp8-e4m3")
    assert sizing["codec"] == "fp8-e4m3" and sizing["compression_ratio"] == 2.0
    assert sizing["stored_bytes"] == round(sizing["raw_bytes"] / 2.0)
    assert sizing["config"]["extract"] == {"codec": "fp8-e4m3"}
    main([*REFERENCE, "--codec", "fp8-e4m3"])
    assert "at 2.00x compression (fp8-e4m3, lossy; assumed: measure it" in capsys.readouterr().out
    main([*REFERENCE, "--ratio", "1.6"])  # a measured ratio is not called assumed
    assert "at 1.60x compression (shuffle-zstd1)\n" in capsys.readouterr().out


def test_reference_case_raw_bytes_are_exact(capsys: pytest.CaptureFixture) -> None:
    sizing = run_json(capsys, *REFERENCE)
    assert sizing["raw_bytes"] == 10000 * 1740 * ((3 + 1) * 7168 * 2 + 5)
    assert sizing["stored_bytes"] == round(sizing["raw_bytes"] / DEFAULT_RATIO)
    assert sizing["config"] == {"plan": {"shard_tokens": sizing["shard_tokens"]}}
    # Without a throughput, shards aim at the default stored size and never exceed it.
    assert 0.9 < sizing["stored_bytes_per_shard"] / DEFAULT_STORED_BYTES_PER_SHARD <= 1.0
    main(REFERENCE)
    text = capsys.readouterr().out
    assert "997.9 GB" in text and f"shard_tokens: {sizing['shard_tokens']}" in text


@pytest.mark.parametrize("factor", [2, 5])
def test_projections_scale_linearly(factor: int) -> None:
    base = project(hidden_size=4096, samples=1000, mean_tokens=800)
    more_samples = project(hidden_size=4096, samples=1000 * factor, mean_tokens=800)
    longer = project(hidden_size=4096, samples=1000, mean_tokens=800 * factor)
    for scaled in (more_samples, longer):
        assert scaled.tokens == factor * base.tokens
        assert scaled.raw_bytes == factor * base.raw_bytes
        assert scaled.stored_bytes == pytest.approx(factor * base.stored_bytes, abs=1)
        assert scaled.shard_tokens == base.shard_tokens  # the shard size is per job, not per run
        # Shard counts are rounded up, so they scale to within one shard per base shard.
        assert factor * (base.shards - 1) < scaled.shards <= factor * base.shards
    # The activations scale with hidden size and captured layers (ids and mask do not).
    wider = project(hidden_size=4096 * factor, samples=1000, mean_tokens=800)
    assert wider.raw_bytes - base.tokens * 5 == factor * (base.raw_bytes - base.tokens * 5)


def test_shard_size_from_throughput_and_job_length(capsys: pytest.CaptureFixture) -> None:
    sizing = run_json(capsys, *REFERENCE, "--tokens-per-s", "2000", "--job-hours", "0.5")
    assert sizing["shard_tokens"] == 2000 * 0.5 * 3600
    assert sizing["shards"] == 5  # 17.4M tokens / 3.6M per shard, rounded up
    assert sizing["hours_per_shard"] <= 0.5


def test_sample_cap_is_raised_when_it_would_decide_the_shard_size() -> None:
    short = project(hidden_size=1024, samples=100_000, mean_tokens=10, tokens_per_s=100)
    assert short.samples_per_shard > PLAN_MAX_SAMPLES_PER_SHARD
    assert short.config["plan"]["max_samples_per_shard"] >= short.samples_per_shard


def test_sample_cap_constant_is_the_schema_default() -> None:
    schema = yaml.safe_load((REPO / "rules" / "schemas" / "config.schema.yaml").read_text())
    plan = schema["properties"]["plan"]["properties"]
    assert plan["max_samples_per_shard"]["default"] == PLAN_MAX_SAMPLES_PER_SHARD


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "text_config"])
def test_model_dir_gives_the_same_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture, nested: bool
) -> None:
    text = {"num_hidden_layers": 61, "hidden_size": 7168}
    config = {"model_type": "vlm", "text_config": text, "hidden_size": 1} if nested else text
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_model = run_json(capsys, "--model", str(tmp_path), *REFERENCE[4:])
    assert from_model == run_json(capsys, *REFERENCE)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--layers", "61", "--hidden", "7168", "--samples", "0", "--mean-tokens", "1740"],
         "--samples"),
        (["--layers", "61", "--hidden", "-5", "--samples", "10", "--mean-tokens", "1740"],
         "--hidden"),
        (["--layers", "61", "--hidden", "7168", "--samples", "10", "--mean-tokens", "x"],
         "--mean-tokens"),
        (["--layers", "61", "--samples", "10", "--mean-tokens", "1740"], "--hidden"),
        (["--layers", "61", "--hidden", "7168", "--mean-tokens", "1740"], "--samples"),
        (["--model", "/nonexistent", "--samples", "10", "--mean-tokens", "1740"], "--model"),
        ([*REFERENCE, "--job-hours", "2"], "--tokens-per-s"),
    ],
)  # fmt: skip
def test_invalid_input_names_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and flag in error


def test_finished_run_projection_against_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    lengths = [[120 + (11 * i + 5 * s) % 60 for i in range(8)] for s in range(4)]
    results = fake_results(tmp_path, lengths, done=4)
    shape = ["--hidden", str(HIDDEN), "--num-aux", str(AUX)]
    check = run_json(capsys, "--results", str(results), *shape)
    rows = {row["quantity"]: row for row in check["rows"]}
    tokens = sum(map(sum, lengths))
    assert rows["samples"]["actual"] == 32 and rows["tokens"]["actual"] == tokens
    # Samples and tokens default to the run's own: only the ratio can be off.
    assert rows["tokens"]["relative_error"] == 0 and rows["raw bytes"]["relative_error"] == 0
    measured = rows["compression"]["actual"]
    stored = rows["stored bytes"]
    assert stored["relative_error"] == pytest.approx(measured / DEFAULT_RATIO - 1, abs=1e-3)
    # With the measured ratio the projection matches what is on disk.
    exact = run_json(capsys, "--results", str(results), *shape, "--ratio", str(measured))
    assert abs({r["quantity"]: r for r in exact["rows"]}["stored bytes"]["relative_error"]) < 1e-3
    main(["--results", str(results), *shape])
    assert "stored bytes" in capsys.readouterr().out


def test_results_shape_comes_from_the_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = fake_results(tmp_path, [[100] * 3] * 2, done=2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "hidden_size": HIDDEN}))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"target": {"model": str(model)}}))
    from_config = run_json(capsys, "--results", str(results), "--config", str(config))
    assert from_config == run_json(capsys, "--results", str(results), "--hidden", str(HIDDEN),
                                   "--layers", "8")  # fmt: skip


def test_unfinished_run_is_refused(tmp_path: Path) -> None:
    results = fake_results(tmp_path, [[100] * 3] * 3, done=1)
    with pytest.raises(SystemExit, match=r"1/3 shards extracted"):
        main(["--results", str(results), "--hidden", str(HIDDEN), "--layers", "8"])
