"""The client side of vLLM's OpenAI-compatible servers: a generation server (`vllm serve`) and our
extraction server (`python -m eagleflow.extraction_server`).

One pooled HTTP session per server, on which urllib3 retries connection errors, timeouts, 429
and 5xx with exponential backoff; the server's model name; requests run on threads with their
results consumed in order; and, for an extraction server, where it wrote a request's hidden
states and whether it captures the layers and the target a shard needs. Request payloads belong
to their callers (`eagleflow.generate.completion_payload`, the extract stage's prefills).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from eagleflow.extraction_server import SERVER_INFO
from eagleflow.fingerprint import target_fingerprint
from eagleflow.logs import InputError

log = logging.getLogger(__name__)

# Transient answers worth another try: too many requests, and any server error.
RETRY_STATUSES = frozenset({429, *range(500, 600)})


class _LoggedRetry(Retry):
    """urllib3's `Retry`, logging a retry after an error status as a warning in the job's log
    (urllib3 already warns of retries after connection errors and timeouts)."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> Retry:
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        if response is not None:
            attempt = len(retry.history)
            where = f"{_pool.host}:{_pool.port}{url}" if _pool is not None else url
            log.warning(
                "request to %s failed (%d); retry %d/%d in %.1fs",
                where,
                response.status,
                attempt,
                attempt + (retry.total or 0),
                retry.get_backoff_time(),
            )
        return retry


class ServerClient:
    """Requests to one server at `url` over a pooled session (connections reused) with room for
    `connections` at once; POSTs retry transient failures `retries` times (urllib3's schedule:
    the first at once, then after 2, 4, 8, ... × `backoff_s`, or as the server's Retry-After
    says) and wait `timeout_s` at most for an answer. Use as a context manager, or `close()`.
    """

    def __init__(
        self,
        url: str,
        *,
        retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 600.0,
        connections: int = 8,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        retry = _LoggedRetry(
            total=retries,
            backoff_factor=backoff_s,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=None,  # POST too: a completion request can be sent again
            raise_on_status=False,  # the last answer is returned, and reported by post_json
        )
        adapter = HTTPAdapter(max_retries=retry, pool_maxsize=max(connections, 1))
        self.session = requests.Session()
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def post_json(self, path: str, payload: dict) -> dict:
        """POST `payload` to `path` (e.g. "/v1/completions") and return the JSON answer;
        requests.HTTPError with the status and the start of the body when it is an error."""
        response = self.session.post(f"{self.url}{path}", json=payload, timeout=self.timeout_s)
        if response.status_code >= 400:
            raise requests.HTTPError(
                f"{response.status_code}: {response.text[:300]}", response=response
            )
        return response.json()

    def complete(self, payload: dict) -> dict:
        """POST `payload` to the server's /v1/completions, retrying transient failures."""
        return self.post_json("/v1/completions", payload)


def server_model_name(url: str, timeout: float = 10.0, purpose: str = "generation") -> str:
    """The first model a server lists; InputError naming the URL when it cannot be reached."""
    try:
        response = requests.get(f"{url.rstrip('/')}/v1/models", timeout=timeout)
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (requests.RequestException, KeyError, IndexError, ValueError) as err:
        raise InputError(
            f"{purpose} server {url} is unreachable or lists no model: {err}"
        ) from None


class ServerFailed(InputError):
    """A server stopped answering in the middle of a job: one line naming it (nothing of the
    job's output is kept; a rerun starts on the next server that answers)."""


def server_urls(configured: str | Sequence[str] | None) -> list[str]:
    """`server_url` as configured (one URL, or a list: one server per node) as a list."""
    if configured is None:
        return []
    return [configured] if isinstance(configured, str) else list(configured)


def servers_for_shard(urls: Sequence[str], shard: str) -> list[str]:
    """The servers a shard job tries, in order: shard k starts on server k mod n (shard jobs
    spread evenly and deterministically), then the others in turn."""
    if not urls:
        return []
    start = int(shard) % len(urls)
    return [*urls[start:], *urls[:start]]


def first_live_server(urls: Sequence[str], purpose: str) -> str:
    """The first server in `urls` that answers (lists a model); the ones that do not are
    logged. One InputError naming every server when none answers."""
    failures = []
    for url in urls:
        try:
            server_model_name(url, purpose=purpose)
            return url
        except InputError as err:
            failures.append(str(err))
            if len(urls) > 1:
                log.warning("%s; trying the next server", err)
    raise InputError("; ".join(failures) or f"no {purpose} server configured")


@contextlib.contextmanager
def failures_named(url: str, purpose: str) -> Iterator[None]:
    """A request that still fails after its retries ends the job with one line naming the
    server (the writers leave nothing partial behind)."""
    try:
        yield
    except requests.RequestException as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ServerFailed(
            f"{purpose} server {url} failed during the job ({type(err).__name__}: {reason}); "
            "nothing of this shard was kept; a rerun starts on the next server that answers"
        ) from None


T = TypeVar("T")
R = TypeVar("R")


def in_order_on_threads(
    call: Callable[[T], R], items: Sequence[T], concurrency: int
) -> Iterator[tuple[T, R]]:
    """(item, call(item)) in the order of `items`, the calls running on `concurrency` threads
    at most 2x `concurrency` ahead of the one consumed: a server stays busy, and the results
    waiting (files in its storage) stay bounded whatever the shard size."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(concurrency) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append((item, pool.submit(call, item)))
            if len(pending) == 2 * concurrency:
                oldest, result = pending.popleft()
                yield oldest, result.result()
        while pending:
            oldest, result = pending.popleft()
            yield oldest, result.result()


def server_states_path(url: str, response: dict, sample_id: str) -> str:
    """Where an extraction server wrote the hidden states of the request answered by
    `response`; a clear error when the server is not one."""
    path = (response.get("kv_transfer_params") or {}).get("hidden_states_path")
    if path is None:
        raise InputError(
            f"server {url} returned no hidden states for {sample_id}: it is not an extraction "
            "server (start it with `python -m eagleflow.extraction_server --extract-layers`)"
        )
    return path


def check_server_info(url: str, path: str, ids: list[int], model_dir: str | Path) -> None:
    """Fail unless the server that wrote `path` captures exactly `ids` of this target."""
    info_path = Path(path).parent / SERVER_INFO
    if not info_path.is_file():
        raise InputError(
            f"extraction server {url} wrote {path}, but {info_path} is missing: start the server "
            "with `python -m eagleflow.extraction_server MODEL --extract-layers ... "
            "--storage DIR` on a disk this job can read"
        )
    info = json.loads(info_path.read_text())
    if info["layer_ids"] != sorted(ids):
        raise InputError(
            f"extraction server {url} captures layers {info['layer_ids']}, this shard needs "
            f"{sorted(ids)} (extract.aux_layer_ids + the last layer): restart the server"
        )
    if info["target_fingerprint"] != target_fingerprint(model_dir):
        raise InputError(f"extraction server {url} serves another target than {model_dir}")
