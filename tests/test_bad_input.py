"""Bad inputs: each one gives one clear error that names the item (file:line, key, layer id,
path), a non-zero exit, and no output that looks complete.

The inventory of bad inputs, tested here or elsewhere (pytest's count of this module is the
count of the cases added here):

1. empty prompt file: covered in tests/test_prompts.py::test_empty_or_missing_file_is_an_error.
2. malformed JSON line: covered in tests/test_prompts.py::test_bad_line_fails_naming_file_and_line
   and, with on_error: skip, tests/test_workflow.py::test_skipped_prompt_lines_are_counted.
3. non-UTF-8 bytes: covered in tests/test_prompts.py::test_bad_line_fails_naming_file_and_line
   and, with on_error: skip, tests/test_workflow.py::test_skipped_prompt_lines_are_counted.
4. unknown role: covered in tests/test_prompts.py::test_bad_line_fails_naming_file_and_line and
   tests/test_workflow.py::test_bad_prompt_line_fails_naming_file_and_line (the job's exit, log
   and outputs; cases 1-3 fail the job through the same `log_job_errors` path).
5. duplicate ids: an `id` claimed by two conversations fails the job, a repeated conversation
   is dropped and counted whatever its `id`: here. The function: covered in
   tests/test_prompts.py::test_conflicting_user_ids_are_an_error and
   tests/test_prompts.py::test_three_formats_normalize_to_one_form_with_stable_ids.
6. prompt longer than target.max_model_len: here (the plan job, the only place that checks it).
7. vocab.draft_vocab_size larger than the target's rows: here (the vocab job). The function:
   covered in tests/test_drafter.py::test_vocab_map_is_top_ids_ascending_with_offsets.
8. aux layer id out of range or repeated: here, at `snakemake -n` (also in a fresh directory).
   An aux id equal to the last layer's: covered in
   tests/test_extract_workflow.py::test_changed_layer_ids_rerun_every_extract_job_only.
   The check: covered in tests/test_extract.py::test_bad_layer_ids_are_named and
   tests/test_extract.py::test_extract_shard_refuses_bad_ids.
9. target.model without a tokenizer: here, at `snakemake -n`. Of an architecture transformers
   does not know: here, in the plan job (the first job that reads the target).
10. config paths that do not exist: target.model and prompts.paths covered in
    tests/test_config.py::test_dry_run_fails_on_paths_that_do_not_exist; vocab.reuse (checked
    by the vocab job, not at `snakemake -n`): here.
11. disk too small for extraction: covered in
    tests/test_extract_workflow.py::test_extraction_refuses_to_start_without_disk and
    tests/test_status.py::test_preflight_refuses_and_says_by_how_much.
12. a target config.json that is not JSON, or whose decoder settings lack the layer count or
    width: here, at `snakemake -n`, naming the file.
13. a broken line in a file one job hands the next (plan, responses, tokens): here, naming the
    file and line (the jobs read them with one reader, eagleflow.files.read_jsonl).
14. an engine option vLLM would refuse only when a job builds its engine: covered in
    tests/test_config.py::test_engine_options_vllm_would_refuse_are_named_when_the_workflow_starts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import deep_merge, run_snakemake, scheduled_outputs, write_config

from eagleflow.files import read_jsonl
from eagleflow.logs import InputError
from eagleflow.prompts import prompt_id


def override_config(workdir: Path, overrides: dict) -> None:
    """Merge `overrides` into workdir/config.yaml (the config that workdir's outputs came from)."""
    path = workdir / "config.yaml"
    merged = deep_merge(yaml.safe_load(path.read_text()), overrides)
    # Key order kept: Snakemake compares dict params in order, and a reordered `demo_target`
    # section would rebuild the demo target and everything after it.
    path.write_text(yaml.safe_dump(merged, sort_keys=False))


def write_prompt_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def assert_one_clean_error(result: subprocess.CompletedProcess, message: str, log: Path) -> None:
    """A failed run whose job reported one error, `message`, in its log and on the terminal
    (where Snakemake echoes the log after the job's own line), with no traceback anywhere."""
    output = result.stdout + result.stderr
    log_text = log.read_text()
    assert result.returncode != 0
    log_errors = [line for line in log_text.splitlines() if " ERROR " in line]
    assert len(log_errors) == 1 and message in log_errors[0], log_text
    assert {line for line in output.splitlines() if " ERROR " in line} == set(log_errors)
    assert "Traceback" not in log_text and "Traceback" not in output


def test_prompt_id_claimed_by_two_conversations_fails_naming_both_lines(tmp_path: Path) -> None:
    prompts = write_prompt_lines(
        tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "one"}, {"id": "a", "prompt": "two"}]
    )
    write_config(tmp_path, {"prompts": {"paths": [str(prompts)]}})
    result = run_snakemake(tmp_path, "results/prompts/prompts.jsonl", check=False)
    assert_one_clean_error(
        result,
        f"{prompts}:2: id 'a' already used by a different conversation at {prompts}:1",
        tmp_path / "results/logs/normalize_prompts.log",
    )
    assert not (tmp_path / "results/prompts/prompts.jsonl").exists()
    assert not (tmp_path / "results/prompts/stats.json").exists()


def test_repeated_conversation_is_dropped_and_counted_whatever_its_id(tmp_path: Path) -> None:
    prompts = write_prompt_lines(
        tmp_path / "prompts.jsonl",
        [
            {"id": "a", "prompt": "one"},
            {"id": "a", "prompt": "one"},  # the same id for the same conversation
            {"id": "b", "prompt": "one"},  # another id for the same conversation
            {"prompt": "two"},
        ],
    )
    write_config(tmp_path, {"prompts": {"paths": [str(prompts)]}})
    run_snakemake(tmp_path, "results/prompts/prompts.jsonl")
    kept = [json.loads(line) for line in (tmp_path / "results/prompts/prompts.jsonl").open()]
    assert [(r.get("user_id"), r["source"]) for r in kept] == [
        ("a", f"{prompts}:1"),
        (None, f"{prompts}:4"),
    ]
    log = (tmp_path / "results/logs/normalize_prompts.log").read_text()
    assert "2 prompts kept from 4 lines: 2 duplicates dropped, 0 bad lines skipped" in log


def test_prompt_longer_than_max_model_len_fails_the_plan_naming_it(
    demo_run: Path, tmp_path: Path
) -> None:
    long_prompt = {"prompt": " ".join(["Sort 3, 1, 2."] * 40)}
    prompts = write_prompt_lines(
        tmp_path / "prompts.jsonl", [{"prompt": "Sort 3, 1, 2."}, long_prompt]
    )
    max_model_len = 64
    write_config(
        tmp_path,
        {
            "target": {
                "model": str(demo_run / "results/demo/target"),
                "max_model_len": max_model_len,
            },
            "prompts": {"paths": [str(prompts)]},
        },
    )
    result = run_snakemake(tmp_path, "results/plan", check=False)
    long_id = prompt_id([{"role": "user", "content": long_prompt["prompt"]}])
    match = re.search(
        rf"{re.escape(str(prompts))}:2: prompt {long_id} has (\d+) tokens, no room for an answer "
        rf"within target.max_model_len={max_model_len}",
        result.stderr,
    )
    assert match, result.stderr[-3000:]
    assert int(match.group(1)) >= max_model_len
    assert_one_clean_error(result, match.group(0), tmp_path / "results/logs/plan.log")
    assert not (tmp_path / "results/plan").exists()


def test_prompt_longer_than_max_model_len_is_skipped_and_counted_under_skip(
    demo_run: Path, tmp_path: Path
) -> None:
    long_prompt = {"prompt": " ".join(["Sort 3, 1, 2."] * 40)}
    prompts = write_prompt_lines(
        tmp_path / "prompts.jsonl", [{"prompt": "Sort 3, 1, 2."}, long_prompt]
    )
    write_config(
        tmp_path,
        {
            "target": {"model": str(demo_run / "results/demo/target"), "max_model_len": 64},
            "prompts": {"paths": [str(prompts)], "on_error": "skip"},
        },
    )
    run_snakemake(tmp_path, "results/plan")
    plan = json.loads((tmp_path / "results/plan/plan.json").read_text())
    long_id = prompt_id([{"role": "user", "content": long_prompt["prompt"]}])
    assert plan["samples"] == 1
    [skipped] = plan["skipped"]
    assert skipped["source"] == f"{prompts}:2" and skipped["request"] == long_id
    assert skipped["reason"] == "too long" and skipped["prompt_tokens"] >= 64
    assert "1 skipped" in (tmp_path / "results/logs/plan.log").read_text()


def demo_target_vocab_rows(workdir: Path) -> int:
    return json.loads((workdir / "results/demo/target/config.json").read_text())["vocab_size"]


@pytest.mark.parametrize("setting", ["draft_vocab_size", "reuse"])
def test_bad_vocab_setting_fails_the_vocab_job_naming_the_key(
    demo_copy: Path, tmp_path: Path, setting: str
) -> None:
    rows = demo_target_vocab_rows(demo_copy)
    if setting == "draft_vocab_size":
        value: int | str = rows + 1
        message = f"vocab.draft_vocab_size: {rows + 1} is outside [1, {rows}]"
    else:
        value = str(tmp_path / "no-such-vocab.safetensors")
        message = f"vocab.reuse: {value}: no vocab file or model.safetensors there"
    override_config(demo_copy, {"vocab": {setting: value}})
    vocab_outputs = ["results/vocab/coverage.json", "results/vocab/vocab.safetensors"]
    # Only the vocab job may run: anything more would be minutes of unrelated work.
    dry_run = run_snakemake(demo_copy, "results/vocab/vocab.safetensors", "-n")
    assert scheduled_outputs(dry_run.stdout, "results/") == vocab_outputs
    result = run_snakemake(demo_copy, "results/vocab/vocab.safetensors", check=False)
    assert_one_clean_error(result, message, demo_copy / "results/logs/vocab.log")
    # The earlier run's vocab was removed before the job ran; nothing took its place.
    assert not (demo_copy / "results/vocab/vocab.safetensors").exists()
    assert not (demo_copy / "results/vocab/coverage.json").exists()


@pytest.mark.parametrize(
    ("aux_layer_ids", "message"),
    [
        ([2, 4, 9], "layer id 9 is out of range: ids must lie in [1, 8]"),
        ([0, 4, 5], "layer id 0 is out of range: ids must lie in [1, 8]"),
        ([2, 5, 2], "layer id 2 appears more than once"),
    ],
    ids=["above-last-layer", "zero", "repeated"],
)
def test_bad_aux_layer_id_fails_the_dry_run_naming_the_id(
    tmp_path: Path, aux_layer_ids: list[int], message: str
) -> None:
    """In a fresh directory: the ids are checked before anything is planned or built."""
    write_config(tmp_path, {"extract": {"aux_layer_ids": aux_layer_ids}})
    result = run_snakemake(tmp_path, "-n", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert output.count(f"extract.aux_layer_ids: {message}") == 1, output[-3000:]
    assert "Traceback" not in output
    assert not (tmp_path / "results").exists()


def test_target_without_tokenizer_fails_the_dry_run_naming_it(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    write_config(tmp_path, {"target": {"model": str(model)}})
    result = run_snakemake(tmp_path, "-n", check=False)
    assert result.returncode != 0
    assert f"target.model: {model} has no tokenizer" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        ('{"architectures": ["LlamaForCausalLM"],', "config.json: not JSON"),
        (
            '{"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {}}',
            "config.json: the decoder's settings (text_config) lack num_hidden_layers, hidden_size",
        ),
    ],
    ids=["not-json", "no-layer-count"],
)
def test_broken_target_config_fails_the_dry_run_naming_the_file(
    tmp_path: Path, config_text: str, message: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config_text)
    (model / "tokenizer.json").write_text("{}")
    write_config(tmp_path, {"target": {"model": str(model)}})
    result = run_snakemake(tmp_path, "-n", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{model}/{message}" in output, output[-3000:]
    assert not (tmp_path / "results").exists()


def test_broken_line_of_a_jobs_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "shard-00003.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b", "prompt_ids": [1, 2\n')
    with pytest.raises(InputError, match=re.escape(f"{path}, line 3: not JSON")):
        read_jsonl(path)


def test_unsupported_architecture_fails_the_plan_naming_it(demo_run: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(demo_run / "results/demo/target", model)
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="foo", architectures=["FooForCausalLM"])
    (model / "config.json").write_text(json.dumps(config))
    prompts = write_prompt_lines(tmp_path / "prompts.jsonl", [{"prompt": "Sort 3, 1, 2."}])
    write_config(tmp_path, {"target": {"model": str(model)}, "prompts": {"paths": [str(prompts)]}})
    result = run_snakemake(tmp_path, "results/plan", check=False)
    message = f"target.model: {model} cannot be loaded: The checkpoint you are trying to load has "
    assert_one_clean_error(result, message + "model type `foo`", tmp_path / "results/logs/plan.log")
    assert not (tmp_path / "results/plan").exists()
