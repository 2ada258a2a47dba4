"""Several servers (one per node): the deterministic spread of shard jobs, the fall-over to the
next server that answers, and a server failing mid-job named in one line. Real HTTP against a
stand-in of the `/v1/models` endpoint (the full two-server workflow run with vLLM servers is in
tests/test_extract_workflow.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from conftest import free_port

from eagleflow.logs import InputError
from eagleflow.server_client import (
    ServerFailed,
    failures_named,
    first_live_server,
    server_urls,
    servers_for_shard,
)


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "target"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_shard_jobs_spread_over_the_servers_deterministically() -> None:
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    assert server_urls("http://a:1") == ["http://a:1"] and server_urls(None) == []
    assert servers_for_shard(urls, "00000") == urls
    assert servers_for_shard(urls, "00004") == ["http://b:1", "http://c:1", "http://a:1"]
    firsts = [servers_for_shard(urls, f"{k:05d}")[0] for k in range(9)]
    assert [firsts.count(url) for url in urls] == [3, 3, 3]


def test_a_dead_server_is_passed_over_and_named(live_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert first_live_server([dead, live_url], "extraction") == (live_url, "target")
    with pytest.raises(InputError, match=f"extraction server {dead} is unreachable"):
        first_live_server([dead], "extraction")


def test_a_server_failing_mid_job_is_one_line_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerFailed) as err, failures_named(url, "generation"):
        requests.get(f"{url}/v1/completions", timeout=2)
    message = str(err.value)
    assert message.startswith(f"generation server {url} failed during the job (ConnectionError")
    assert "\n" not in message and "a rerun starts on the next server" in message
