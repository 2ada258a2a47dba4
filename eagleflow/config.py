"""Config checks that name the offending key: schema errors, paths that do not exist, and a
serving check that would gate nothing."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

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


def raise_if_invalid(problems: list[str]) -> None:
    """Raise one InputError listing every problem, or return if there is none."""
    if problems:
        raise InputError("invalid config:\n  " + "\n  ".join(problems))
