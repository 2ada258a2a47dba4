"""Target responses: the target model answers each planned request, thinking included.

Three backends give the same record format: `vllm` (in-process engine), `server` (any
OpenAI-compatible endpoint that returns token ids, e.g. `vllm serve`, reached through
`eagleflow.server_client`) and `hf` (transformers).
Prompt ids are rendered once, at plan time, with the target's own chat template; responses keep
the ids the engine produced, so no later stage ever re-tokenizes generated text.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleflow.engine import trusts_remote_code
from eagleflow.files import read_jsonl, write_jsonl
from eagleflow.hf_target import load_causal_lm
from eagleflow.logs import InputError
from eagleflow.progress import token_progress
from eagleflow.sampling import SamplingLimits
from eagleflow.server_client import (
    ServerClient,
    failures_named,
    first_live_server,
    server_model_name,
    server_urls,
)
from eagleflow.target_config import target_tokenizer


@dataclass(frozen=True)
class Sampling:
    """A request's sampling by vLLM's names (top_k and top_p: see SamplingLimits)."""

    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    top_k: int = SamplingLimits.top_k

    @classmethod
    def from_params(cls, params: Any) -> Sampling:
        """From a generation rule's params (top_k there only where it limits sampling)."""
        limits = SamplingLimits.of(params)
        return cls(params.temperature, limits.top_p, params.max_new_tokens, params.seed,
                   limits.top_k)  # fmt: skip


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    finish_reason: str  # "stop" (end of turn) or "length" (hit max_new_tokens)

    def kept(self, on_truncated: str) -> bool:
        """Whether the answer is kept: truncated ones are dropped with `on_truncated: drop`."""
        return not (self.finish_reason == "length" and on_truncated == "drop")


def request_seed(seed: int, sample_id: str) -> int:
    """A per-request seed: a sample's answer does not depend on its shard or batch neighbours."""
    digest = hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def generate_vllm(
    model_dir: str | Path,
    prompt_ids: Sequence[list[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    max_model_len: int,
    options: Mapping[str, Any] | None = None,
) -> list[Completion]:
    """Generate in-process with vLLM (its progress bar shows prompts/s, tokens/s and ETA);
    `options`: the user's engine options."""
    from vllm.inputs import TokensPrompt

    from eagleflow.engine import build_llm

    llm = build_llm(model_dir, seed=sampling.seed, max_model_len=max_model_len, options=options)
    params = [vllm_sampling_params(sampling, seed) for seed in seeds]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
    return [vllm_completion(out) for out in outputs]


def vllm_sampling_params(sampling: Sampling, seed: int, **extra_args: Any) -> Any:
    """vLLM `SamplingParams` of one request; `extra_args` reach the engine's plug-ins (the KV
    connector reads `kv_transfer_params` there)."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_new_tokens,
        seed=seed,
        detokenize=False,
        extra_args=extra_args or None,
    )


def vllm_completion(output: Any) -> Completion:
    """The completion of a finished vLLM `RequestOutput`."""
    choice = output.outputs[0]
    reason = "length" if choice.finish_reason == "length" else "stop"
    return Completion(list(choice.token_ids), reason)


def generate_hf(
    model_dir: str | Path,
    prompt_ids: Sequence[list[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    batch_size: int = 16,
    trust_remote_code: bool = False,
) -> list[Completion]:
    """Generate with transformers, batches of similar prompt length, left-padded."""
    import torch

    from eagleflow.precision import compute_dtype

    model = load_causal_lm(
        model_dir, dtype=compute_dtype("cpu"), trust_remote_code=trust_remote_code
    ).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    text_config = model.config.get_text_config()  # a wrapper's decoder settings
    pad = text_config.pad_token_id if text_config.pad_token_id is not None else min(eos_ids)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    completions: dict[int, Completion] = {}
    with (
        token_progress(len(prompt_ids), "generate (hf)", unit="prompt") as progress,
        torch.inference_mode(),
    ):
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            width = max(len(prompt_ids[i]) for i in batch)
            input_ids = torch.tensor(
                [[pad] * (width - len(prompt_ids[i])) + prompt_ids[i] for i in batch]
            )
            attention = torch.tensor(
                [[0] * (width - len(prompt_ids[i])) + [1] * len(prompt_ids[i]) for i in batch]
            )
            # One seed per batch: transformers samples a batch from one generator.
            torch.manual_seed(seeds[batch[0]])
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=sampling.max_new_tokens,
                do_sample=sampling.temperature > 0,
                temperature=sampling.temperature if sampling.temperature > 0 else None,
                top_p=sampling.top_p if sampling.temperature > 0 else None,
                # explicit: transformers fills in top_k 50 where the model sets none
                top_k=sampling.top_k if sampling.temperature > 0 else None,
                pad_token_id=pad,
            )
            produced = 0
            for row, i in zip(out[:, width:].tolist(), batch, strict=True):
                ends = [k for k, token in enumerate(row) if token in eos_ids]
                ids = row[: ends[0] + 1] if ends else row
                completions[i] = Completion(ids, "stop" if ends else "length")
                produced += len(ids)
            progress.advance(len(batch), produced)
    return [completions[i] for i in range(len(prompt_ids))]


def completion_payload(
    model: str, prompt_ids: list[int], seed: int, sampling: Sampling, **extra: Any
) -> dict:
    """A /v1/completions request that sends token ids and asks for token ids back."""
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": seed,
        "return_token_ids": True,
        "skip_special_tokens": False,
        **extra,
    }


def server_completion(url: str, body: dict) -> Completion:
    """The Completion of a /v1/completions response (which must carry token ids)."""
    choice = body["choices"][0]
    if choice.get("token_ids") is None:
        raise InputError(
            f"server {url} returned no token ids; it must support `return_token_ids` "
            "(vLLM does) because re-tokenizing generated text changes ids"
        )
    reason = "length" if choice.get("finish_reason") == "length" else "stop"
    return Completion(list(choice["token_ids"]), reason)


def generate_server(
    url: str,
    prompt_ids: Sequence[list[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    *,
    concurrency: int = 8,
    retries: int = 4,
    backoff_s: float = 1.0,
    timeout_s: float = 600.0,
) -> list[Completion]:
    """Generate against an OpenAI-compatible server, `concurrency` requests in flight at most.

    Prompts are sent as token ids and the server must return the generated ids
    (`return_token_ids`, as vLLM does): re-tokenizing returned text would change ids.
    """
    model = server_model_name(url)

    def one(i: int) -> Completion:
        payload = completion_payload(model, prompt_ids[i], seeds[i], sampling)
        return server_completion(url, client.complete(payload))

    completions: list[Completion | None] = [None] * len(prompt_ids)
    with (
        ServerClient(
            url, retries=retries, backoff_s=backoff_s, timeout_s=timeout_s, connections=concurrency
        ) as client,
        token_progress(len(prompt_ids), "generate (server)", unit="prompt") as progress,
        ThreadPoolExecutor(max_workers=concurrency) as pool,
    ):
        futures = {pool.submit(one, i): i for i in range(len(prompt_ids))}
        for future in as_completed(futures):
            i = futures[future]
            completions[i] = future.result()
            progress.advance(1, len(completions[i].token_ids))
    return completions  # type: ignore[return-value]


def generate_completions(
    requests: list[dict],
    model_dir: str | Path,
    backend: str,
    sampling: Sampling,
    *,
    max_model_len: int,
    server_url: str | Sequence[str] | None = None,
    server_concurrency: int = 8,
    engine_options: Mapping[str, Any] | None = None,
) -> list[Completion]:
    """Completions for planned requests with the chosen backend, in request order."""
    prompt_ids = [r["prompt_token_ids"] for r in requests]
    seeds = [request_seed(sampling.seed, r["id"]) for r in requests]
    if backend == "vllm":
        return generate_vllm(model_dir, prompt_ids, seeds, sampling, max_model_len, engine_options)
    if backend == "hf":
        trust = trusts_remote_code(engine_options)
        return generate_hf(model_dir, prompt_ids, seeds, sampling, trust_remote_code=trust)
    if backend == "server":
        urls = server_urls(server_url)
        if not urls:
            raise InputError("generation.server_url: required when generation.backend is 'server'")
        url = first_live_server(urls, "generation")
        with failures_named(url, "generation"):
            return generate_server(url, prompt_ids, seeds, sampling, concurrency=server_concurrency)
    raise InputError(f"generation.backend: unknown backend {backend!r} (vllm, server, hf)")


def response_records(
    requests: list[dict],
    completions: list[Completion],
    tokenizer: Any,  # the target's (transformers' or its own remote-code class)
    on_truncated: str,
) -> tuple[list[dict], int]:
    """Join requests and completions into output records; drop truncated ones if asked.

    Returns the records and the number of truncated answers (kept or dropped).
    """
    records, truncated = [], 0
    for request, completion in zip(requests, completions, strict=True):
        is_truncated = completion.finish_reason == "length"
        truncated += is_truncated
        if not completion.kept(on_truncated):
            continue
        ids = completion.token_ids
        # The end-of-turn token belongs in the ids (the drafter must learn to predict it) but
        # not in the readable text.
        text_ids = ids[:-1] if completion.finish_reason == "stop" and ids else ids
        records.append(
            {
                "id": request["id"],
                "prompt_id": request["prompt_id"],
                "messages": request["messages"],
                "prompt_token_ids": request["prompt_token_ids"],
                "response_token_ids": ids,
                "response_text": tokenizer.decode(text_ids, skip_special_tokens=False),
                "finish_reason": completion.finish_reason,
                "truncated": is_truncated,
                "prompt_tokens": len(request["prompt_token_ids"]),
                "response_tokens": len(ids),
            }
        )
    return records, truncated


def generate_shard(
    requests_path: str | Path,
    model_dir: str | Path,
    out_path: str | Path,
    *,
    backend: str,
    sampling: Sampling,
    on_truncated: str,
    max_model_len: int,
    server_url: str | Sequence[str] | None = None,
    server_concurrency: int = 8,
    engine_options: Mapping[str, Any] | None = None,
) -> dict:
    """Answer one planned shard and write its records atomically; return a summary."""

    requests = read_jsonl(requests_path)
    start = time.monotonic()
    completions = generate_completions(
        requests,
        model_dir,
        backend,
        sampling,
        max_model_len=max_model_len,
        server_url=server_url,
        server_concurrency=server_concurrency,
        engine_options=engine_options,
    )
    seconds = time.monotonic() - start
    tokenizer = target_tokenizer(model_dir, trust_remote_code=trusts_remote_code(engine_options))
    records, truncated = response_records(requests, completions, tokenizer, on_truncated)
    write_jsonl(out_path, records)
    generated = sum(len(c.token_ids) for c in completions)
    return {
        "requests": len(requests),
        "records": len(records),
        "truncated": truncated,
        "generated_tokens": generated,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(generated / seconds, 1) if seconds else None,
    }
