"""The one place that constructs vLLM engines (generation, extraction, serving evaluation)."""

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def build_llm(
    model_dir: str | Path,
    *,
    seed: int = 0,
    max_model_len: int = 1024,
    in_process_core: bool = False,
    **engine_kwargs: Any,
) -> "vllm.LLM":
    """A `vllm.LLM` for `model_dir`, with settings that suit the platform (CPU or GPU).

    `engine_kwargs` go to `vllm.LLM` and override the defaults set here. vLLM spawns worker
    processes, so a script that calls this needs an `if __name__ == "__main__":` guard.

    `in_process_core` runs vLLM's engine core in this process: requests added together are then
    scheduled together (a core in its own process starts on the first requests while the rest
    still arrive, so batches, and with them the kernels' rounding, vary from run to run). The
    extraction needs that for bit-identical shards; generation keeps the separate core, which
    decodes several times faster here and whose greedy token ids do not depend on batching.
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
    settings: dict[str, Any] = {
        "model": str(model_dir),
        "seed": seed,
        "max_model_len": max_model_len,
        **memory_settings(),
        "enforce_eager": default_enforce_eager(),
        "dtype": engine_dtype(),
    }
    settings.update(engine_kwargs)
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
