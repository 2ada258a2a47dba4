"""Shared test helpers: run the real workflow with Snakemake in temporary working directories."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from faults import (  # scheduled_outputs: re-exported for the tests
    scheduled_outputs,  # noqa: F401
    snakemake_command,
)

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIG = REPO / "tests" / "config.test.yaml"

# Outputs of training and of everything downstream of it (evaluation, the report's plots).
TRAINING_AND_DOWNSTREAM = [
    "results/drafter/metrics.tsv", "results/drafter/speculators", "results/drafter/vllm",
    "results/eval/offline.json", "results/eval/serving.json",
    "results/report/acceptance.png", "results/report/shards.png",
    "results/report/training.png", "results/report/vocab.png",
]  # fmt: skip


@pytest.fixture
def gpu_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `nvidia-smi` on PATH: the workflow plans as on an NVIDIA machine (GPU
    requests per job), though no GPU is here."""
    stub = tmp_path / "gpu-machine" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\necho 'a stand-in: no GPU here'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")


def gpus_per_job(dry_run_stdout: str) -> dict[str, list[int]]:
    """The GPUs each job of a `snakemake -n` listing requests, by rule ([] when none does)."""
    gpus: dict[str, list[int]] = {}
    rule = ""
    for line in dry_run_stdout.splitlines():
        if line.startswith(("rule ", "checkpoint ", "localrule ")):
            rule = line.split()[1].rstrip(":")
            gpus.setdefault(rule, [])
        elif match := re.search(r"resources: .*\bgpu=(\d+)", line):
            gpus[rule].append(int(match.group(1)))
    return gpus


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def stand_in_server(body: bytes, content_type: str = "text/plain") -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering every GET with `body`; yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def deep_merge(base: dict, override: dict) -> dict:
    """`base` with `override` applied key by key (nested dicts merged, other values replaced)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_config(workdir: Path, overrides: dict | None = None) -> Path:
    """Write workdir/config.yaml: the test config with `overrides` merged in."""
    config = deep_merge(yaml.safe_load(TEST_CONFIG.read_text()), overrides or {})
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_snakemake(
    workdir: Path, *args: str, check: bool = True, timeout: float = 1800
) -> subprocess.CompletedProcess:
    """Run the repo's Snakefile in `workdir` (which holds config.yaml) and return the result.

    Output is captured; on an unexpected exit status the tail of it is shown in the failure.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = snakemake_command(workdir, *args)
    result = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        tail = (result.stdout + result.stderr)[-6000:]
        pytest.fail(f"snakemake {' '.join(args)} exited {result.returncode}:\n{tail}")
    return result


DEMO_RUN_FIXTURES = {"demo_run", "demo_copy"}


def _uses_demo_run(item: pytest.Item) -> bool:
    return bool(DEMO_RUN_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a test that needs the demo run go last (each module stays whole, so its
    module fixtures are set up once): the others run while the demo run builds."""
    waiting = {item.module for item in items if _uses_demo_run(item)}
    items.sort(key=lambda item: item.module in waiting)  # stable: file order otherwise


@dataclass
class DemoBuild:
    """The demo run's working directory, where its exit status will appear, and its log."""

    workdir: Path
    exit_status: Path
    log: Path


def _session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every process of this session shares: under pytest-xdist each
    worker has its own base directory inside it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def demo_run_started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DemoBuild | None]:
    """Start the demo run (the whole workflow on the test config, with the real demo target:
    minutes) in the background when the session begins, if a selected test needs it: the
    tests that do not need it run meanwhile. Under pytest-xdist the first worker starts it and
    every worker uses that one run."""
    needed = any(_uses_demo_run(item) for item in request.session.items)
    if os.environ.get("EAGLEFLOW_DEMO_RUN") or not needed:
        yield None
        return
    root = _session_root(tmp_path_factory)
    build = DemoBuild(root / "demo_run", root / "demo_run.exit", root / "demo_run.log")
    process = None
    with open(root / "demo_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker creates it; the others find it started
        if not build.workdir.exists():
            build.workdir.mkdir()
            write_config(build.workdir)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            # The shell records the exit status where every worker can read it.
            command = ["sh", "-c", f'"$@"; echo $? > {build.exit_status}', "sh"]
            with open(build.log, "w") as out:
                process = subprocess.Popen(
                    command + snakemake_command(build.workdir), cwd=build.workdir, env=env,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
    try:
        yield build
    finally:
        if process is not None and process.poll() is None:
            alone = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) == 1
            try:
                if not alone:  # another worker may still need it
                    process.wait()
            finally:  # stop the run and its jobs (alone, or interrupted)
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait()


@pytest.fixture(scope="session")
def demo_run(demo_run_started: DemoBuild | None) -> Path:
    """A working directory where the whole workflow ran once on the test config (started in
    the background by `demo_run_started`; this waits for it), shared by every test that needs
    a trained target. Tests on both xdist workers read it at once: a test that changes anything
    in it (even config.yaml for a dry run) works on `demo_copy` instead.
    `EAGLEFLOW_DEMO_RUN=/path` reuses a finished run while developing tests.
    """
    if os.environ.get("EAGLEFLOW_DEMO_RUN"):
        return Path(os.environ["EAGLEFLOW_DEMO_RUN"])
    assert demo_run_started is not None
    build = demo_run_started
    deadline = time.monotonic() + 3600
    while not build.exit_status.exists() or not build.exit_status.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"the demo run did not finish in an hour:\n{build.log.read_text()[-6000:]}")
        time.sleep(1)
    status = build.exit_status.read_text().strip()
    if status != "0":
        pytest.fail(f"the demo run exited {status}:\n{build.log.read_text()[-6000:]}")
    return build.workdir


@pytest.fixture
def demo_copy(demo_run: Path, tmp_path: Path) -> Path:
    """A private copy of the finished demo run (mtimes and Snakemake metadata kept)."""
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy, symlinks=True)
    return copy
