"""Config checks that name the offending key: schema errors, paths that do not exist, engine
options vLLM would refuse, and a serving check that would gate nothing."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from pathlib import Path

import jsonschema
import yaml

from eagleflow.engine import LAYOUT_OPTIONS, STATE_OPTIONS, engine_options
from eagleflow.fingerprint import TOKENIZER_VOCAB_FILES
from eagleflow.logs import InputError
from eagleflow.sampling import SamplingLimits, data_sampling_unserved
from eagleflow.target_config import untrusted_tokenizer_code


def _key(path: list) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def schema_errors(config: dict, schema_path: str | Path) -> list[str]:
    """One line per schema violation, each starting with the dotted key it concerns."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for error in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path))):
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(allowed))
            for key in unknown:
                lines.append(
                    f"{_key([*error.path, key])}: unknown config key (allowed here: "
                    f"{', '.join(allowed)})"
                )
        else:
            lines.append(f"{_key(list(error.path))}: {error.message}")
    return lines


def missing_paths(config: dict) -> list[str]:
    """Configured input paths that do not exist or lack what the workflow reads from them (or
    cannot be used as configured), each named by its key."""
    missing = []
    model = config["target"]["model"]
    if model and not Path(model).is_dir():
        missing.append(f"target.model: {model} is not a directory")
    elif model and not (Path(model) / "config.json").is_file():
        missing.append(f"target.model: {model} has no config.json (a Hugging Face model directory)")
    elif model and not any((Path(model) / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        missing.append(
            f"target.model: {model} has no tokenizer ({', '.join(TOKENIZER_VOCAB_FILES)}): "
            "prompts are rendered with the target's own tokenizer and chat template"
        )
    elif model:
        refusal = untrusted_tokenizer_code(model, config["target"].get("trust_remote_code", False))
        missing += [refusal] if refusal else []
    for i, path in enumerate(config["prompts"]["paths"]):
        if not Path(path).is_file():
            missing.append(f"prompts.paths[{i}]: {path} does not exist")
    return missing


def ungated_serving(config: dict) -> list[str]:
    """A serving check that would gate no acceptance figure (`data_sampling_unserved`)."""
    data, served = config["generation"], config["evaluate"]
    problem = data_sampling_unserved(
        served["temperatures"], SamplingLimits.of(served), data["temperature"],
        SamplingLimits.of(data),
    )  # fmt: skip
    return [problem] if problem else []


# Stages that build vLLM engines from their engine options, with the backend that builds them
# in the job's process (a `server` backend's engine is started by the user, with its own flags).
ENGINE_STAGES = ("generation", "extract", "evaluate")
# What the serving check sets in the drafter's speculative_config itself.
SERVING_CHECK_SPECULATIVE = {
    "method": "eagle3",
    "model": "the exported drafter",
    "num_speculative_tokens": "evaluate.serving_k and other_served_ks",
    "draft_sample_method": "evaluate.draft_sample_method",
}


@functools.cache
def vllm_dataclass_fields(module: str, name: str) -> frozenset[str] | None:
    """Field names of dataclass `name` in the installed vLLM's `module`, read from its source:
    importing vLLM (torch with it) at parse time takes ~10 s. None where vLLM is not installed
    in this environment (with --use-conda the jobs' environments have it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0], *module.split(".")).with_suffix(".py")
    if not source.is_file():
        return None
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return frozenset(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return None


def _unknown(key: str, name: str, known: frozenset[str] | None, what: str) -> list[str]:
    if known is None or name in known:
        return []
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return [f"{key}: not {what} of the installed vLLM{hint}"]


def engine_option_problems(config: dict) -> list[str]:
    """Engine options that vLLM would refuse when a job builds its engine (hours into a run for a
    large target), each named by its key: `extra` keys that are no vLLM engine argument, a named
    option given under `extra`, data_parallel_size > 1 for an engine built in the job (vLLM's
    LLM refuses it), and a `speculative_config` where the serving check does not serve a drafter
    or that sets what the check sets."""
    engine_args = vllm_dataclass_fields("engine.arg_utils", "EngineArgs")
    speculative_args = vllm_dataclass_fields("config.speculative", "SpeculativeConfig")
    named = {*STATE_OPTIONS, *LAYOUT_OPTIONS}
    problems = []
    sections = {"engine": config["engine"]}
    sections.update({f"{stage}.engine": config[stage]["engine"] for stage in ENGINE_STAGES})
    for where, section in sections.items():
        for name, value in (section.get("extra") or {}).items():
            key = f"{where}.extra.{name}"
            if name in named:
                problems.append(f"{key}: {where}.{name} is a key of its own: set it there")
            elif name == "speculative_config" and where != "evaluate.engine":
                problems.append(
                    f"{key}: only the serving check serves a drafter; set it as "
                    "evaluate.engine.extra.speculative_config"
                )
            elif name == "speculative_config":
                for spec_name in value or {}:
                    if spec_name in SERVING_CHECK_SPECULATIVE:
                        problems.append(
                            f"{key}.{spec_name}: set by the serving check "
                            f"({SERVING_CHECK_SPECULATIVE[spec_name]})"
                        )
                    else:
                        problems += _unknown(
                            f"{key}.{spec_name}", spec_name, speculative_args,
                            "a speculative_config field",
                        )  # fmt: skip
            else:
                problems += _unknown(key, name, engine_args, "an engine argument")
    for stage in ENGINE_STAGES:
        replicas = engine_options(config, stage).get("data_parallel_size") or 1
        if config[stage]["backend"] == "vllm" and replicas > 1:
            set_by_stage = config[stage]["engine"].get("data_parallel_size") is not None
            where = f"{stage}.engine" if set_by_stage else "engine"
            shards = "" if stage == "evaluate" else "run shard jobs side by side instead, or "
            problems.append(
                f"{where}.data_parallel_size: {replicas}: {stage} builds its engine in the job "
                f"(backend vllm) and vLLM's LLM runs one replica per process; {shards}use "
                f"{stage}.backend: server with a server started with --data-parallel-size"
            )
    return problems


def raise_if_invalid(problems: list[str]) -> None:
    """Raise one InputError listing every problem, or return if there is none."""
    if problems:
        raise InputError("invalid config:\n  " + "\n  ".join(problems))
