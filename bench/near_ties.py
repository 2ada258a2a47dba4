"""Where draft position 1 misses: our drafter and the peer's (bench/peer.py's speculators
export) on every held-out response slot, by how far apart the target's two most likely tokens
are there.

    .venv/bin/python bench/near_ties.py --results RUN/results --ours OURS_EXPORT \
        --peer PEER_WORK/peer/export

A slot t drafts token t + 2 from the target's states at t and token t + 1: the first draft of a
chain, what vLLM checks first. A hit: the drafter's argmax is the target's token (greedy data:
its argmax). Slots are bucketed by the target's own margin, p(top 1) - p(top 2), computed as the
training teacher computes it (bf16 logits of the stored last state); for the near ties it also
counts how many bf16 steps of the logits separate the two, i.e. how much of the target's pick
its rounding decides, and how often the teacher's own argmax is the generated token (whether
the near ties' labels are the engine's picks or noise). Offline, no engine: reads the shards,
the target's head and both exports.
"""

from __future__ import annotations

import argparse
import glob
import json
import tempfile
from pathlib import Path

import torch
from rows import Row, finish, output_arguments
from safetensors.torch import load_file, save_file

from eagleflow.compare import NEAR_TIE
from eagleflow.drafter import Eagle3Drafter, load_target_head
from eagleflow.evaluate import response_start
from eagleflow.export import RECIPE_FLAGS, load_drafter
from eagleflow.loader import list_samples
from eagleflow.shards import open_shard
from eagleflow.vocab import draft_to_target_ids

MARGINS = ((0.0, NEAR_TIE), (NEAR_TIE, 0.2), (0.2, 0.5), (0.5, 1.01))


def load_peer(peer_export: Path, ours_export: Path) -> Eagle3Drafter:
    """The peer's speculators export as our module: our export's config (bench/peer.py gives
    both drafters the same shapes) with the peer's recipe flags, and the peer's weights with its
    decoder layer renamed from `layers.0.`."""
    peer_config = json.loads((peer_export / "config.json").read_text())
    config = json.loads((ours_export / "config.json").read_text())
    config.update({name: bool(peer_config.get(name, False)) for name in RECIPE_FLAGS})
    tensors = {
        name.replace("layers.0.", "midlayer.", 1): value
        for name, value in load_file(str(peer_export / "model.safetensors")).items()
    }
    with tempfile.TemporaryDirectory() as converted:
        (Path(converted) / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(Path(converted) / "model.safetensors"))
        return load_drafter(converted)[0]


@torch.no_grad()
def slot_table(results: Path, drafters: dict[str, Eagle3Drafter], heldout: float) -> dict:
    """Per held-out response slot: the target's margin, its top-two logit gap in bf16 steps,
    whether the teacher's argmax is the generated token, and each drafter's hit."""
    shards = sorted(glob.glob(str(results / "hidden" / "shard-*.zarr")))
    head = load_target_head(results / "demo" / "target")
    margin, steps, teacher = [], [], []
    hits = {name: [] for name in drafters}
    draft_ids = {name: draft_to_target_ids(model.d2t) for name, model in drafters.items()}
    opened = {}
    for ref in list_samples(shards, heldout, "heldout"):
        sample = opened.setdefault(ref.shard, open_shard(shards[ref.shard])).sample(ref.index)
        ids = sample["input_ids"]
        length = len(ids)
        slots = torch.arange(max(0, response_start(sample["loss_mask"]) - 1), length - 2)
        logits = head.full_logits(sample["last"]).float()[slots + 1]
        top = logits.topk(2, -1).values
        probs = torch.softmax(logits, -1).topk(2, -1).values
        margin.append(probs[:, 0] - probs[:, 1])
        ulp = 2.0 ** (torch.floor(torch.log2(top[:, 0].abs().clamp(min=1e-30))) - 7)
        steps.append((top[:, 0] - top[:, 1]) / ulp)
        teacher.append(logits.argmax(-1) == ids[slots + 2])
        aux = sample["aux"].reshape(length, -1).float()[None]
        for name, model in drafters.items():
            first = model(aux, ids[None], head.embed, 1)[0][0]  # an own embedding wins
            drafted = draft_ids[name][model.logits(first).argmax(-1)]
            hits[name].append(drafted[slots] == ids[slots + 2])
    return {
        "margin": torch.cat(margin),
        "bf16_steps": torch.cat(steps),
        "teacher_hits": torch.cat(teacher),
        "hits": {name: torch.cat(h) for name, h in hits.items()},
    }


def figures_of(table: dict) -> dict:
    margin, hits = table["margin"], table["hits"]
    misses = {name: (~h).sum().item() for name, h in hits.items()}
    buckets = []
    for low, high in MARGINS:
        chosen = (margin >= low) & (margin < high)
        buckets.append({
            "margin": [low, high], "share": chosen.float().mean().item(),
            "hit": {n: h[chosen].float().mean().item() for n, h in hits.items()},
            "share_of_misses": {n: (~h[chosen]).sum().item() / misses[n] for n, h in hits.items()},
        })  # fmt: skip
    near = margin < NEAR_TIE
    rounding = near & (table["bf16_steps"] <= 2)
    teacher = table["teacher_hits"].float()
    return {
        "slots": len(margin),
        "teacher_hit": {"all": teacher.mean().item(), "near_tie": teacher[near].mean().item()},
        "hit": {name: h.float().mean().item() for name, h in hits.items()},
        "buckets": buckets,
        "near_tie_bf16_steps": {
            str(k): (table["bf16_steps"][near] <= k).float().mean().item() for k in (0, 1, 2, 4)
        },
        "near_tie_hit": {
            "within_2_steps": {n: h[rounding].float().mean().item() for n, h in hits.items()},
            "further": {n: h[near & ~rounding].float().mean().item() for n, h in hits.items()},
        },
    }


def table_rows(f: dict) -> list[Row]:
    def pair(values: dict) -> str:
        return f"{values['ours']:.3f} / {values['peer']:.3f}"

    rows = [
        Row("held-out response slots (each drafts the token after next)", f"{f['slots']:,}"),
        Row(
            "the training teacher's argmax is the generated token (the engine's greedy pick): "
            "all slots / near ties",
            f"{f['teacher_hit']['all']:.3f} / {f['teacher_hit']['near_tie']:.3f}",
            key="teacher_hit",
        ),
        Row("draft position 1 hit rate, ours / peer", pair(f["hit"]), key="hit"),
    ]
    for b in f["buckets"]:
        low, high = b["margin"]
        bound = f"[{low:g}, {high:g})" if high <= 1 else f">= {low:g}"
        rows.append(Row(
            f"slots where the target's top two probabilities differ by {bound}: share of slots; "
            "hit rate ours / peer; share of all misses ours / peer",
            f"{b['share']:.3f}; {pair(b['hit'])}; {pair(b['share_of_misses'])}", key="buckets",
        ))  # fmt: skip
    steps = f["near_tie_bf16_steps"]
    rows.append(Row(
        f"near ties (margin < {NEAR_TIE:g}) whose two logits are 0 / <= 1 / <= 2 / <= 4 bf16 "
        "steps apart",
        " / ".join(f"{steps[k]:.3f}" for k in ("0", "1", "2", "4")), key="near_tie_bf16_steps",
    ))  # fmt: skip
    near_hit = f["near_tie_hit"]
    rows.append(Row(
        "near ties: hit rate where the two logits are <= 2 bf16 steps apart / further, "
        "ours; peer",
        f"{near_hit['within_2_steps']['ours']:.3f} / {near_hit['further']['ours']:.3f}; "
        f"{near_hit['within_2_steps']['peer']:.3f} / {near_hit['further']['peer']:.3f}",
        key="near_tie_hit",
    ))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--ours", type=Path, help="our vLLM export (default: the run's)")
    parser.add_argument("--peer", type=Path, required=True, help="the peer's export")
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--title", default="Where draft position 1 misses, ours and the peer's")
    output_arguments(parser, "near_ties")
    args = parser.parse_args()
    ours = args.ours or args.results / "drafter" / "vllm"
    drafters = {"ours": load_drafter(ours)[0], "peer": load_peer(args.peer, ours)}
    figures = figures_of(slot_table(args.results, drafters, args.heldout_fraction))
    finish(args, args.title, table_rows(figures), figures)


if __name__ == "__main__":
    main()
