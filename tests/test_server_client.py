"""Several servers (one per node): the deterministic spread of shard jobs, the fall-over to the
next server that answers, and a server failing mid-job named in one line. Real HTTP against a
stand-in of the `/v1/models` endpoint (the full two-server workflow run with vLLM servers is in
tests/test_extract_workflow.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests
from conftest import free_port, stand_in_server

from eagleflow.logs import InputError
from eagleflow.server_client import (
    ServerFailed,
    failures_named,
    first_live_server,
    server_urls,
    servers_for_shard,
)


@pytest.fixture
def live_url() -> Iterator[str]:
    """A stand-in vLLM server: its `/v1/models` names the model `target`."""
    with stand_in_server(
        json.dumps({"data": [{"id": "target"}]}).encode(), "application/json"
    ) as url:
        yield url


def test_shard_jobs_spread_over_the_servers_deterministically() -> None:
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    assert server_urls("http://a:1") == ["http://a:1"] and server_urls(None) == []
    assert servers_for_shard(urls, "00000") == urls
    assert servers_for_shard(urls, "00004") == ["http://b:1", "http://c:1", "http://a:1"]
    firsts = [servers_for_shard(urls, f"{k:05d}")[0] for k in range(9)]
    assert [firsts.count(url) for url in urls] == [3, 3, 3]


def test_a_dead_server_is_passed_over_and_named(live_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert first_live_server([dead, live_url], "extraction") == live_url
    with pytest.raises(InputError, match=f"extraction server {dead} is unreachable"):
        first_live_server([dead], "extraction")


def test_a_server_failing_mid_job_is_one_line_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerFailed) as err, failures_named(url, "generation"):
        requests.get(f"{url}/v1/completions", timeout=2)
    message = str(err.value)
    assert message.startswith(f"generation server {url} failed during the job (ConnectionError")
    assert "\n" not in message and "a rerun starts on the next server" in message
