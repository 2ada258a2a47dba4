"""Training samples from target responses: the engine's own ids and an assistant loss mask.

Ids are the prompt ids the plan rendered with the target's chat template followed by the
response ids the engine produced; generated text is never re-tokenized (re-tokenizing changed
the ids of 2 in 300 conversations on a small target, and template drift between data and
serving is a known cause of acceptance collapse).
"""

from __future__ import annotations

from pathlib import Path

from eagleflow.files import read_jsonl, write_jsonl


def training_sample(record: dict, max_len: int) -> dict:
    """One sample: ids = prompt + response, loss on every response token (thinking included,
    the end-of-turn token too), cut at `max_len` tokens."""
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    input_ids = (prompt + response)[:max_len]
    loss_mask = ([0] * len(prompt) + [1] * len(response))[:max_len]
    return {
        "id": record["id"],
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "num_tokens": len(input_ids),
        "loss_tokens": sum(loss_mask),
        "cut_at_max_len": len(prompt) + len(response) > max_len,
    }


def kept_sample(record: dict, max_len: int) -> dict | None:
    """`training_sample`, or None when it has no loss token (a prompt filling `max_len` teaches
    nothing). The one rule for which samples a shard holds, whichever pass captures them."""
    sample = training_sample(record, max_len)
    return sample if sample["loss_tokens"] > 0 else None


def prepare_shard(responses_path: str | Path, out_path: str | Path, *, max_len: int) -> dict:
    """Write one shard's training samples atomically; samples with no loss token are dropped
    and counted."""
    records = read_jsonl(responses_path)
    kept = [s for s in (kept_sample(r, max_len) for r in records) if s is not None]
    write_jsonl(out_path, kept)
    return {
        "samples": len(kept),
        "dropped_without_loss_tokens": len(records) - len(kept),
        "cut_at_max_len": sum(s["cut_at_max_len"] for s in kept),
        "tokens": sum(s["num_tokens"] for s in kept),
        "loss_tokens": sum(s["loss_tokens"] for s in kept),
    }
