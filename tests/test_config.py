"""Config validation: a wrong key or type fails at `snakemake -n` time and names the key."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import REPO, run_snakemake, write_config

from eagleflow.config import missing_paths, schema_errors
from eagleflow.fingerprint import tokenizer_fingerprint

SCHEMA = REPO / "rules" / "schemas" / "config.schema.yaml"


def test_repo_config_and_test_config_are_valid() -> None:
    for path in (REPO / "config.yaml", REPO / "tests" / "config.test.yaml"):
        assert schema_errors(yaml.safe_load(path.read_text()), SCHEMA) == []


def test_schema_errors_name_the_key() -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["prompts"]["on_eror"] = "skip"
    config["demo_target"]["num_layers"] = 4
    config["tempreature"] = 0.7
    assert schema_errors(config, SCHEMA) == [
        "tempreature: unknown config key (allowed here: demo_prompts, demo_target, evaluate, "
        "extract, generation, plan, prepare, prompts, target, train, vocab)",
        "demo_target.num_layers: 4 is less than the minimum of 8",
        "prompts.on_eror: unknown config key (allowed here: limit, on_error, paths)",
    ]


def test_dry_run_lists_the_dag(tmp_path: Path) -> None:
    write_config(tmp_path)
    result = run_snakemake(tmp_path, "-n")
    for rule in ("demo_target", "demo_prompts", "normalize_prompts"):
        assert f"rule {rule}:" in result.stdout


def test_dry_run_fails_on_a_misspelled_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"prompts": {"on_eror": "skip"}})
    result = run_snakemake(tmp_path, "-n", check=False)
    assert result.returncode != 0
    assert "prompts.on_eror: unknown config key" in result.stdout + result.stderr


def test_dry_run_fails_on_paths_that_do_not_exist(tmp_path: Path) -> None:
    write_config(
        tmp_path, {"target": {"model": "no/such/model"}, "prompts": {"paths": ["x.jsonl"]}}
    )
    result = run_snakemake(tmp_path, "-n", check=False)
    assert result.returncode != 0
    assert "target.model: no/such/model is not a directory" in result.stdout + result.stderr
    assert "prompts.paths[0]: x.jsonl does not exist" in result.stdout + result.stderr


def test_tokenizers_without_tokenizer_json_pass_the_check_and_the_fingerprint(
    tmp_path: Path,
) -> None:
    """A Kimi-style target (tiktoken.model + the tokenizer class it ships, no tokenizer.json)
    and a sentencepiece one pass the config check, and their files enter the fingerprint."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    (kimi / "config.json").write_text("{}")
    config["target"]["model"] = str(kimi)
    assert missing_paths(config) == [
        f"target.model: {kimi} has no tokenizer (tokenizer.json, tokenizer.model, vocab.json, "
        "tiktoken.model): prompts are rendered with the target's own tokenizer and chat template"
    ]
    (kimi / "tiktoken.model").write_text("aGVsbG8= 0\n")
    (kimi / "tokenization_kimi.py").write_text("class TikTokenTokenizer: ...\n")
    assert missing_paths(config) == []
    before = tokenizer_fingerprint(kimi)
    (kimi / "tokenization_kimi.py").write_text("class TikTokenTokenizer: pass\n")
    assert before is not None and tokenizer_fingerprint(kimi) != before
    before = tokenizer_fingerprint(kimi)
    (kimi / "tiktoken.model").write_text("aGVsbG8= 1\n")
    assert tokenizer_fingerprint(kimi) != before

    spm = tmp_path / "spm"
    spm.mkdir()
    (spm / "config.json").write_text("{}")
    (spm / "tokenizer.model").write_bytes(b"\x0a\x01sentencepiece")
    config["target"]["model"] = str(spm)
    assert missing_paths(config) == [] and tokenizer_fingerprint(spm) is not None


def test_schema_lists_exactly_the_codecs_the_writer_knows() -> None:
    """`extract.codec`'s enum repeats `eagleflow.shards.CODECS`: the two must not drift."""
    from eagleflow.shards import CODECS, DEFAULT_CODEC

    codec = yaml.safe_load(SCHEMA.read_text())["properties"]["extract"]["properties"]["codec"]
    assert sorted(codec["enum"]) == sorted(CODECS) and codec["default"] == DEFAULT_CODEC
