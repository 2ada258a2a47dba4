"""The real workflow, run by Snakemake in temporary directories."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from conftest import run_snakemake, write_config

from eagleflow.demo.quality import (
    MIN_DISTINCT_4,
    MIN_THINK_WELLFORMED,
    distinct_ngram_ratio,
    split_think,
)
from eagleflow.files import read_jsonl


def test_bad_prompt_line_fails_naming_file_and_line(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"messages": [{"role": "bot", "content": "x"}]}\n')
    write_config(tmp_path, {"prompts": {"paths": [str(prompts)]}})
    result = run_snakemake(tmp_path, "results/prompts/prompts.jsonl", check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"{prompts}:2: turn 0: unknown role 'bot'" in output
    assert "Traceback" not in Path(tmp_path, "results/logs/normalize_prompts.log").read_text()
    # Nothing that looks complete is left behind.
    assert not (tmp_path / "results/prompts/prompts.jsonl").exists()
    assert not (tmp_path / "results/prompts/stats.json").exists()


def test_skipped_prompt_lines_are_counted(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(
        b'{"prompt": "one"}\nnot json\n{"prompt": "one"}\n\xff\xfe\n{"prompt": "2"}\n'
    )
    write_config(tmp_path, {"prompts": {"paths": [str(prompts)], "on_error": "skip"}})
    run_snakemake(tmp_path, "results/prompts/prompts.jsonl")
    stats = json.loads((tmp_path / "results/prompts/stats.json").read_text())
    assert (stats["kept"], stats["duplicates"], stats["skipped"]) == (2, 1, 2)
    assert stats["skipped_examples"] == [
        f"{prompts}:2: malformed JSON (Expecting value at column 1)",
        f"{prompts}:4: not valid UTF-8 (byte 0)",
    ]
    log = (tmp_path / "results/logs/normalize_prompts.log").read_text()
    assert "2 prompts kept from 5 lines: 1 duplicates dropped, 2 bad lines skipped" in log


def test_demo_run_builds_target_prompts_and_responses(demo_run: Path, demo_copy: Path) -> None:
    target = demo_run / "results/demo/target"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (target / name).is_file(), name
    demo_prompts = read_jsonl(demo_run / "results/demo/prompts.jsonl")
    assert len(demo_prompts) >= 2000
    stats = json.loads((demo_run / "results/prompts/stats.json").read_text())
    assert stats["kept"] == 300  # the test config's limit
    plan = json.loads((demo_run / "results/plan/plan.json").read_text())
    responses = [
        record
        for shard in plan["shards"]
        for record in read_jsonl(demo_run / f"results/responses/shard-{shard['shard']}.jsonl")
    ]
    assert len(plan["shards"]) >= 2
    assert len(responses) == plan["samples"] == 300
    # A finished workflow has nothing left to do, also after its config.yaml is rewritten with
    # the same values in another key order.
    nothing = run_snakemake(demo_run, "-n")
    assert "Nothing to be done" in nothing.stdout + nothing.stderr
    config = demo_copy / "config.yaml"
    config.write_text(yaml.safe_dump(yaml.safe_load(config.read_text()), sort_keys=True))
    reordered = run_snakemake(demo_copy, "-n")
    assert "Nothing to be done" in reordered.stdout + reordered.stderr


def test_demo_target_answers_are_varied_and_well_formed(demo_run: Path) -> None:
    """The greedy answers the workflow generated (the same measure as
    `python -m eagleflow.demo.quality`): a looping or half-trained target fails here."""
    plan = json.loads((demo_run / "results/plan/plan.json").read_text())
    records = [
        record
        for shard in plan["shards"][:2]
        for record in read_jsonl(demo_run / f"results/responses/shard-{shard['shard']}.jsonl")
    ][:200]
    eos = json.loads((demo_run / "results/demo/target/config.json").read_text())["eos_token_id"]
    ids = [[t for t in r["response_token_ids"] if t != eos] for r in records]
    distinct_4 = distinct_ngram_ratio(ids)
    wellformed = sum(split_think(r["response_text"]) is not None for r in records) / len(records)
    print(f"demo target answers: distinct-4 {distinct_4:.3f}, well-formed think {wellformed:.1%}")
    assert len(records) == 200
    assert distinct_4 >= MIN_DISTINCT_4 and wellformed >= MIN_THINK_WELLFORMED
