"""The shard plan: which generation requests go into which shard, sized by estimated tokens.

A shard is the unit of work, scheduling, verification and regeneration (what users call a
"chunk" of the dataset). Shards are packed by tokens, not samples, so jobs take similar time.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagleflow.files import atomic_output, read_jsonl, write_json
from eagleflow.logs import InputError
from eagleflow.target_config import target_tokenizer, untrusted_tokenizer_code

SHARD_FILE = "shard-{}.jsonl"


ASKING_ROLES = ("user", "tool")  # turns an assistant answers


def shard_name(index: int) -> str:
    """The shard id used in file names and Snakemake wildcards: 5 digits, zero-padded."""
    return f"{index:05d}"


def generation_requests(prompts: list[dict], turns: str) -> list[dict]:
    """The requests to generate: one per prompt (`last`) or one per assistant turn (`each`).

    `last` answers the conversation after its final user turn (a trailing assistant turn, if
    any, is replaced). `each` regenerates every assistant turn given the original turns before
    it, so multi-turn data becomes one on-policy sample per assistant turn.
    """
    if turns not in ("last", "each"):
        raise ValueError(f"turns must be 'last' or 'each', not {turns!r}")
    requests = []
    for prompt in prompts:
        messages = prompt["messages"]
        # Answer after the last user turn, or after the last tool result (agentic data).
        asks = [i for i, m in enumerate(messages) if m["role"] in ASKING_ROLES]
        last_user = asks[-1]
        if turns == "last":
            cuts = [last_user + 1]
        else:
            cuts = [
                i
                for i, m in enumerate(messages)
                if m["role"] == "assistant"
                and i > 0
                and messages[i - 1]["role"] in ("user", "tool")
            ]
            if messages[-1]["role"] in ASKING_ROLES:
                cuts.append(len(messages))
        for turn, cut in enumerate(cuts):
            sample_id = prompt["id"] if turns == "last" else f"{prompt['id']}-t{turn}"
            request = {"id": sample_id, "prompt_id": prompt["id"], "messages": messages[:cut]}
            requests.append(request | ({"tools": prompt["tools"]} if "tools" in prompt else {}))
    return requests


def pack_shards(token_estimates: list[int], shard_tokens: int, max_samples: int) -> list[range]:
    """Split requests, in order, into consecutive shards of at most `shard_tokens` estimated
    tokens and `max_samples` samples (a single request larger than the budget gets its own)."""
    shards: list[range] = []
    start, tokens = 0, 0
    for i, estimate in enumerate(token_estimates):
        full = tokens + estimate > shard_tokens or i - start >= max_samples
        if i > start and full:
            shards.append(range(start, i))
            start, tokens = i, 0
        tokens += estimate
    if start < len(token_estimates):
        shards.append(range(start, len(token_estimates)))
    return shards


def write_plan(
    out_dir: str | Path,
    requests: list[dict],
    prompt_token_ids: list[list[int]],
    *,
    expected_response_tokens: int,
    shard_tokens: int,
    max_samples: int,
    skipped: list[dict] | None = None,
) -> dict:
    """Write `out_dir/shard-NNNNN.jsonl` (requests with their prompt token ids) and `plan.json`.

    The directory appears complete or not at all. Same requests and settings give the same plan.
    `skipped`: requests left out (recorded in plan.json with their reason).
    """
    estimates = [len(ids) + expected_response_tokens for ids in prompt_token_ids]
    shards = pack_shards(estimates, shard_tokens, max_samples)
    summary = {"shards": [], "samples": len(requests), "estimated_tokens": sum(estimates)}
    if skipped:
        summary["skipped"] = skipped
    with atomic_output(out_dir) as tmp:
        tmp.mkdir()
        for index, members in enumerate(shards):
            name = shard_name(index)
            lines = [
                json.dumps({**requests[i], "prompt_token_ids": prompt_token_ids[i]})
                for i in members
            ]
            text = "".join(line + "\n" for line in lines)
            (tmp / SHARD_FILE.format(name)).write_text(text)
            summary["shards"].append(
                {
                    "shard": name,
                    "samples": len(members),
                    "estimated_tokens": sum(estimates[i] for i in members),
                    "sha256": hashlib.sha256(text.encode()).hexdigest(),
                }
            )
        write_json(tmp / "plan.json", summary)
    return summary


def _target_tokenizer(model_dir: str | Path, trust_remote_code: bool):
    """The target's tokenizer, after checking that its architecture is one transformers knows
    (the first job that reads the target says so, not the engine much later)."""
    from transformers import AutoConfig

    refusal = untrusted_tokenizer_code(model_dir, trust_remote_code)
    if refusal:
        raise InputError(refusal)
    try:
        AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
        return target_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError, ImportError) as err:
        reason = str(err).splitlines()[0]
        hint = "" if trust_remote_code else " (if it ships code to run: target.trust_remote_code)"
        raise InputError(f"target.model: {model_dir} cannot be loaded: {reason}{hint}") from None


def plan_from_prompts(
    prompts_path: str | Path,
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    turns: str,
    max_model_len: int,
    shard_tokens: int,
    max_samples_per_shard: int,
    expected_response_tokens: int,
    on_error: str = "fail",
    trust_remote_code: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """Render every request's prompt ids with the target's chat template (and its
    `chat_template_kwargs`) and write the plan.

    A prompt the template cannot render, or that leaves no room for a response within
    `max_model_len`, is an error naming its file:line; with `on_error` "skip" it is left out and
    listed in plan.json's `skipped`.
    """
    from eagleflow.chat import render_prompt_ids

    prompts = read_jsonl(prompts_path)
    sources = {p["id"]: p.get("source", p["id"]) for p in prompts}
    requests = generation_requests(prompts, turns)
    tokenizer = _target_tokenizer(model_dir, trust_remote_code)
    kept, kept_ids, skipped = [], [], []
    for request in requests:
        source = sources[request["prompt_id"]]
        try:
            ids = render_prompt_ids(
                tokenizer, request["messages"], chat_template_kwargs, request.get("tools")
            )
        except Exception as err:  # jinja2's TemplateError, or what the template raises
            reason = f"{source}: the chat template cannot render prompt {request['id']}: {err}"
            if on_error != "skip":
                raise InputError(reason) from None
            skipped.append({"source": source, "request": request["id"], "reason": str(err)})
            logging.getLogger("eagleflow").warning("skipped (prompts.on_error: skip): %s", reason)
            continue
        if len(ids) < max_model_len:
            kept.append(request)
            kept_ids.append(ids)
            continue
        reason = (
            f"{source}: prompt {request['id']} has {len(ids)} tokens, "
            f"no room for an answer within target.max_model_len={max_model_len}"
        )
        if on_error != "skip":
            raise InputError(reason)
        skipped.append({"source": source, "request": request["id"],
                        "reason": "too long", "prompt_tokens": len(ids)})  # fmt: skip
        logging.getLogger("eagleflow").warning("skipped (prompts.on_error: skip): %s", reason)
    if not kept:
        raise InputError(
            f"no prompt fits target.max_model_len={max_model_len}: all {len(requests)} skipped"
        )
    return write_plan(
        out_dir,
        kept,
        kept_ids,
        expected_response_tokens=expected_response_tokens,
        shard_tokens=shard_tokens,
        max_samples=max_samples_per_shard,
        skipped=skipped,
    )
