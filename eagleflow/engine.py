"""The one place that constructs vLLM engines (generation, extraction, serving evaluation), and
the engine options users set for them (config `engine:`, by vLLM's own argument names)."""

import json
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagleflow.logs import InputError

if TYPE_CHECKING:
    import vllm

# On GPU, the share of its memory vLLM may take. On CPU, the KV cache size itself: vLLM's CPU
# `gpu_memory_utilization` is a share of one NUMA node's memory that must also hold the engine
# process's own RSS, so on a machine whose node 0 holds 7.6 of its 24 GiB no share worked for
# both an in-process engine (RSS ~0.8 GiB) and a parallel job. VLLM_CPU_KVCACHE_SPACE (GiB), if
# set, still overrides it.
GPU_MEMORY_FRACTION = 0.9
CPU_KV_CACHE_BYTES = 2**30
IN_PROCESS_VARIABLE = "VLLM_ENABLE_V1_MULTIPROCESSING"
# vllm-cpu 0.32's Triton-override scan (`triton_utils.dispatcher._rebind_kernels`, run where the
# worker starts) fails on llvmlite's library wrapper, which numba brings into the process when
# a multimodal wrapper's processor (Kimi-K2.5's) is built or an n-gram proposer runs: an
# in-process core cannot start then (and one in its own process hangs in extraction).
LLVMLITE_SCAN_BUG = "'_lib_fn_wrapper' object has no attribute 'get'"
BLAS_THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# vLLM 0.32 with torch >= 2.12 saves compiled models as "mega AOT artifacts" that it then fails
# to load ("'function' object has no attribute 'finalize_loading'"), so every compiled engine
# compiled from scratch (33-54 s on two cores). Its older compile cache loads: ~7 s warm.
COMPILE_CACHE_ENV = {"VLLM_USE_AOT_COMPILE": "0"}


# Engine options that change the states an engine computes (how the model is split across
# devices reorders its sums; dtype, quantization and KV-cache dtype change its numbers): a change
# reruns the stage's jobs. Every other named option (the batch and memory knobs, the number of
# data-parallel replicas) changes how fast, not what: it reruns nothing. `extra` options are
# taken as state options, since their effect is unknown here.
STATE_OPTIONS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "enable_expert_parallel",
    "quantization",
    "dtype",
    "kv_cache_dtype",
)
LAYOUT_OPTIONS = (
    "data_parallel_size",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
)
# Set from `target:` for every engine; it decides whether a target loads, not what it computes.
LOAD_OPTIONS = ("trust_remote_code",)


def engine_options(config: Mapping[str, Any], stage: str | None = None) -> dict[str, Any]:
    """The vLLM engine arguments of a stage: config `engine:` with `<stage>.engine:` merged over
    it, key by key (`extra` too, then flattened into the rest); unset (null) keys left out; and
    `trust_remote_code` when `target.trust_remote_code` is set."""
    merged: dict[str, Any] = {}
    if (config.get("target") or {}).get("trust_remote_code"):
        merged["trust_remote_code"] = True
    sections = [config.get("engine") or {}]
    if stage is not None:
        sections.append((config.get(stage) or {}).get("engine") or {})
    for section in sections:
        for key, value in section.items():
            if key == "extra":
                merged.update(value or {})
            elif value is not None:
                merged[key] = value
    return dict(sorted(merged.items()))


def trusts_remote_code(options: Mapping[str, Any] | None) -> bool:
    """Whether these engine options load the target's own code (target.trust_remote_code)."""
    return bool((options or {}).get("trust_remote_code"))


def state_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that change the computed states (rule params: a change reruns the job)."""
    return {k: v for k, v in options.items() if k not in (*LAYOUT_OPTIONS, *LOAD_OPTIONS)}


def engine_world_size(options: Mapping[str, Any]) -> int:
    """Devices one engine of these options occupies: tensor x pipeline x data parallel."""
    sizes = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
    world = 1
    for key in sizes:
        world *= int(options.get(key) or 1)
    return world


def engine_cli_flags(options: Mapping[str, Any]) -> list[str]:
    """The same options as `vllm serve` flags: `--tensor-parallel-size=8`,
    `--enable-expert-parallel` / `--no-enable-expert-parallel`, dicts as JSON."""
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict | list):
            flags.append(f"{flag}={json.dumps(value)}")
        else:
            flags.append(f"{flag}={value}")
    return flags


def cpu_threads_bind(world_size: int) -> str | None:
    """On CPU, one core list per engine worker (`VLLM_CPU_OMP_THREADS_BIND`, e.g. "0|1"): vLLM's
    automatic binding wants a NUMA node per worker ("Not enough allowed NUMA nodes to bind
    threads of 2 local CPUWorkers") and fails on a one-node machine. None for one worker."""
    if world_size <= 1:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < world_size:
        raise InputError(
            f"engine: tensor x pipeline x data parallel = {world_size} CPU engine workers need "
            f"a core each; this job has {len(cpus)}"
        )
    share = len(cpus) // world_size
    return "|".join(
        ",".join(map(str, cpus[i * share : (i + 1) * share])) for i in range(world_size)
    )


def use_compile_cache(env: MutableMapping[str, str] = os.environ) -> None:
    """Make the vLLM engines built with `env` reuse their compiled model (a user's own setting
    of these variables wins)."""
    for name, value in COMPILE_CACHE_ENV.items():
        env.setdefault(name, value)


def memory_settings() -> dict[str, Any]:
    """vLLM's memory settings for this platform: a fixed KV cache on CPU, a share of the GPU."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {"gpu_memory_utilization": GPU_MEMORY_FRACTION}


def default_enforce_eager() -> bool:
    """Eager on CPU: vLLM otherwise compiles the model at start-up, 40 s instead of 20 s for the
    demo target on two cores, and decoding is no faster afterwards. Compiled (CUDA graphs) on
    GPU."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def default_in_process_core(model_dir: str | Path, settings: Mapping[str, Any]) -> bool:
    """On CPU, one engine (no data-parallel replicas) runs its core in the calling process unless
    that is blocked: vLLM otherwise spawns two processes per engine (core, then worker), each
    importing vLLM again (bench/generation.py: start-up and decoding, both ways). On GPU,
    vLLM's default: a core in its own process overlaps scheduling with the device."""
    from vllm.platforms import current_platform

    replicas = int(settings.get("data_parallel_size") or 1)
    return current_platform.is_cpu() and replicas == 1 and not in_process_core_blocked(model_dir)


def in_process_core_blocked(model_dir: str | Path) -> bool:
    """Whether vLLM cannot start an in-process engine core for this target here (the
    `LLVMLITE_SCAN_BUG`): on CPU, once numba's llvmlite is in this process (an earlier engine's
    n-gram proposer imports it), or for a multimodal wrapper (its processor imports numba, as
    Kimi-K2.5's does) with numba installed. A core in its own process then hangs in extraction."""
    import importlib.util
    import sys

    from vllm.platforms import current_platform

    from eagleflow.target_config import read_target_config

    if not current_platform.is_cpu() or importlib.util.find_spec("numba") is None:
        return False
    return "llvmlite" in sys.modules or "text_config" in read_target_config(model_dir)


def build_llm(
    model_dir: str | Path,
    *,
    seed: int = 0,
    max_model_len: int = 1024,
    in_process_core: bool | None = None,
    options: Mapping[str, Any] | None = None,
    **required: Any,
) -> "vllm.LLM":
    """A `vllm.LLM` for `model_dir`, with settings that suit the platform (CPU or GPU).

    `options` (the user's engine options, `engine_options`) override the defaults set here;
    `required` (what the caller's stage needs, e.g. the extraction's connector) overrides both.
    vLLM spawns worker processes, so a script that calls this needs an `if __name__ ==
    "__main__":` guard.

    `in_process_core` runs vLLM's engine core in this process: requests added together are then
    scheduled together (a core in its own process starts on the first requests while the rest
    still arrive, so batches, and with them the kernels' rounding, vary from run to run). The
    extraction needs that for bit-identical shards. None: `default_in_process_core`.
    """
    # Tokenizer and config look-ups must never try to reach a model hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    use_compile_cache()
    import vllm
    from vllm.platforms import current_platform

    from eagleflow.precision import engine_dtype

    if current_platform.is_cpu():
        # vLLM pins its CPU worker's OpenMP threads to the cores it reserves. Thread counts that
        # Snakemake exports for a job (`threads:`) would oversubscribe those cores: generation
        # ran 40x slower with MKL_NUM_THREADS=2 and friends set in the worker's environment.
        for name in BLAS_THREAD_VARIABLES:
            os.environ.pop(name, None)
        bind = cpu_threads_bind(engine_world_size({**(options or {}), **required}))
        if bind is not None:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
    settings: dict[str, Any] = {
        "model": str(model_dir),
        "seed": seed,
        "max_model_len": max_model_len,
        **memory_settings(),
        "enforce_eager": default_enforce_eager(),
        "dtype": engine_dtype(),
    }
    settings.update(options or {})
    settings.update(required)
    if in_process_core is None:
        in_process_core = default_in_process_core(model_dir, settings)
    previous = os.environ.get(IN_PROCESS_VARIABLE)
    if in_process_core:
        os.environ[IN_PROCESS_VARIABLE] = "0"
    try:  # read while the engine is built, not afterwards
        return vllm.LLM(**settings)
    finally:
        if previous is None:
            os.environ.pop(IN_PROCESS_VARIABLE, None)
        else:
            os.environ[IN_PROCESS_VARIABLE] = previous
