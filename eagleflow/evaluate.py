"""Offline acceptance of the exported drafter: the chain simulated on held-out samples (served
in vLLM: eagleflow/serving_check.py).

Offline: on held-out samples, the drafter proposes K tokens from every verified position, the
target's own next tokens (the stored responses) accept the longest matching prefix, and the
target's bonus token moves the position on, as in vLLM. One batched training-time-test pass
gives every slot's chain: a chain's accepted prefix only ever used true tokens as inputs.
Acceptance length counts the bonus token: 1 + accepted / drafts.

vLLM also counts drafts accepted after the end-of-turn token (it counts before truncating the
output). Offline we cannot know what the target would say after the end, so two figures are
kept: `answer_only` (drafts past the end count as rejected) and `upper` (as accepted); the
served value should lie between them (up to greedy near-ties).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from eagleflow.drafter import load_target_head
from eagleflow.export import load_drafter
from eagleflow.files import write_json
from eagleflow.loader import list_samples
from eagleflow.logs import InputError
from eagleflow.progress import token_progress
from eagleflow.sampled import (
    DRAFT_SAMPLE_METHODS,
    WALKS,
    acceptance_probabilities,
    walk_expected,
)
from eagleflow.sampling import UNLIMITED, SamplingLimits
from eagleflow.shards import open_shard
from eagleflow.vocab import draft_to_target_ids


def response_start(loss_mask: torch.Tensor) -> int:
    """First token of the last assistant turn (the answer a served request generates)."""
    mask = loss_mask.tolist()
    start = len(mask)
    while start > 0 and mask[start - 1]:
        start -= 1
    if start == len(mask):
        raise ValueError("sample has no assistant tokens at its end")
    return start


def simulate_chain(matches: torch.Tensor, start: int, length: int, k: int) -> tuple[list, list]:
    """Walk one response as vLLM does. `matches[j, t]`: step j's draft at slot t is the true
    token t+2+j. Returns per draft the accepted count (answer only) and the number of draft
    positions that fell past the end of the sequence."""
    accepted, past_end = [], []
    slot = start - 1  # the prefill's last position: the target has just produced token `start`
    while slot + 1 < length - 1:  # a token after the bonus token remains to be predicted
        available = min(k, length - 2 - slot)  # drafts that have a true token to compare with
        run = 0
        while run < available and matches[run, slot]:
            run += 1
        accepted.append(run)
        past_end.append(k - available if run == available else 0)
        slot += run + 1
    return accepted, past_end


@torch.no_grad()
def offline_acceptance(
    export_dir: str | Path,
    shard_paths: Sequence[str | Path],
    target: str | Path,
    *,
    heldout_fraction: float,
    ks: Sequence[int],
    max_samples: int | None = None,
    temperatures: Sequence[float] = (0.0,),
    draft_sample_method: str = "greedy",
    limits: SamplingLimits = UNLIMITED,
) -> dict:
    """Offline chain acceptance on the held-out split, for each K in `ks`: greedy (`by_k`)
    and, in `by_temperature`, at each of `temperatures` (with `limits`, vLLM's top_k and top_p) as
    vLLM accepts drafts when it samples them by `draft_sample_method` (see
    eagleflow/sampled.py)."""
    if draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise InputError(
            f"evaluate.draft_sample_method: {draft_sample_method!r} is not one of vLLM's "
            f"{list(DRAFT_SAMPLE_METHODS)}"
        )
    model, config = load_drafter(export_dir)
    head = load_target_head(target)
    draft_ids = draft_to_target_ids(model.d2t)
    refs = list_samples(shard_paths, heldout_fraction, "heldout")[:max_samples]
    if not refs:
        raise InputError("offline evaluation: the held-out split is empty")
    steps = max(ks)
    sampled = sorted({float(t) for t in temperatures} - {0.0})
    per_k = {k: {"accepted": [], "past_end": []} for k in ks}
    per_t = {t: {k: {"accepted": [], "past_end": []} for k in ks} for t in sampled}
    generator = torch.Generator().manual_seed(0)
    shards = {}
    with token_progress(len(refs), "evaluate (offline)") as progress:
        for ref in refs:
            shard = shards.setdefault(ref.shard, open_shard(shard_paths[ref.shard]))
            sample = shard.sample(ref.index)
            ids = sample["input_ids"]
            aux = sample["aux"].reshape(len(ids), -1).float()[None]
            outputs = model(aux, ids[None], head.embed, steps)
            length = len(ids)
            # drafted[step, t]: the target id drafted at slot t for token t + 2 + step.
            drafted = torch.stack([draft_ids[model.logits(out[0]).argmax(-1)] for out in outputs])
            matches = torch.zeros(steps, length, dtype=torch.bool)
            for step in range(steps):
                span = max(0, length - 2 - step)
                matches[step, :span] = drafted[step, :span] == ids[2 + step : 2 + step + span]
            start = response_start(sample["loss_mask"])
            for k in ks:
                accepted, past_end = simulate_chain(matches, start, length, k)
                per_k[k]["accepted"] += accepted
                per_k[k]["past_end"] += past_end
            for temperature in sampled:
                accept = acceptance_probabilities(
                    head, sample["last"], drafted, temperature,
                    partial(_step_logits, model, outputs)
                    if draft_sample_method == "probabilistic" else None,
                    draft_ids, limits=limits,
                )  # fmt: skip
                for k in ks:
                    for _ in range(WALKS):
                        accepted, past_end = walk_expected(accept, start, length, k, generator)
                        per_t[temperature][k]["accepted"] += accepted
                        per_t[temperature][k]["past_end"] += past_end
            progress.advance(1, length)
    by_k = {str(k): _summary(v["accepted"], v["past_end"], k) for k, v in per_k.items()}
    by_temperature = {"0.0": {"by_k": by_k}} if 0.0 in temperatures else {}
    for temperature, walks in per_t.items():
        by_temperature[str(temperature)] = {
            "draft_sample_method": draft_sample_method,
            **limits.as_dict(),
            "walks_per_response": WALKS,
            "by_k": {str(k): _summary(v["accepted"], v["past_end"], k) for k, v in walks.items()},
        }
    return {
        "samples": len(refs),
        "draft_sample_method": draft_sample_method,
        **limits.as_dict(),
        "aux_layer_ids": config["aux_layer_ids"],
        "by_k": by_k,
        "by_temperature": by_temperature,
    }


def _step_logits(
    model, outputs: list[torch.Tensor], step: int, slots: torch.Tensor
) -> torch.Tensor:
    """The drafter's logits at chain step `step` for `slots` (of a batch of one sample)."""
    return model.logits(outputs[step][0][slots])


def _summary(accepted: list[int], past_end: list[int], k: int) -> dict:
    drafts = len(accepted)
    total = sum(accepted)
    return {
        "drafts": drafts,
        "accepted": total,
        "mean_acceptance_length": 1 + total / drafts,
        "mean_acceptance_length_upper": 1 + (total + sum(past_end)) / drafts,
        "per_position": [sum(a > j for a in accepted) / drafts for j in range(k)],
    }


def heldout_prompts(
    shard_paths: Sequence[str | Path], heldout_fraction: float, max_prompts: int | None
) -> list[list[int]]:
    """The held-out samples' prompts (everything before the last assistant turn)."""
    prompts = []
    for ref in list_samples(shard_paths, heldout_fraction, "heldout")[:max_prompts]:
        sample = open_shard(shard_paths[ref.shard]).sample(ref.index)
        prompts.append(sample["input_ids"][: response_start(sample["loss_mask"])].tolist())
    return prompts


def write_offline(out_path: str | Path, **kwargs) -> dict:
    report = offline_acceptance(**kwargs)
    write_json(out_path, report)
    return report
