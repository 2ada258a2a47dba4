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


def prepare_shard(responses_path: str | Path, out_path: str | Path, *, max_len: int) -> dict:
    """Write one shard's training samples atomically; samples with no loss token are dropped
    (a prompt filling `max_len` teaches nothing) and counted."""
    samples = [training_sample(r, max_len) for r in read_jsonl(responses_path)]
    kept = [s for s in samples if s["loss_tokens"] > 0]
    write_jsonl(out_path, kept)
    return {
        "samples": len(kept),
        "dropped_without_loss_tokens": len(samples) - len(kept),
        "cut_at_max_len": sum(s["cut_at_max_len"] for s in kept),
        "tokens": sum(s["num_tokens"] for s in kept),
        "loss_tokens": sum(s["loss_tokens"] for s in kept),
    }
