"""Acceptance of the trained drafter vs an untrained one, offline and served, in one run.

Prints, for K speculative tokens: the offline estimate counting only drafts before the end of
the answer, the offline upper figure (drafts past the end counted as accepted, as vLLM's
counters do), the mean acceptance length served in vLLM for the trained export, and the same
for an untrained drafter with the same shapes, vocab and layer ids (expected ~1.0).

    .venv/bin/python bench/acceptance.py --results results --k 3
"""

from __future__ import annotations

import argparse
import glob
import json
import tempfile
from pathlib import Path

import torch


def untrained_export(trained: Path, out: Path) -> None:
    from eagleflow.evaluate import load_drafter
    from eagleflow.export import export_vllm

    model, config = load_drafter(trained)
    torch.manual_seed(0)
    fresh = type(model)(model.cfg, model.d2t, model.t2d)
    export_vllm(fresh, config["aux_layer_ids"], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from eagleflow.evaluate import offline_acceptance, serving_acceptance

    results = Path(args.results)
    shards = sorted(glob.glob(str(results / "hidden/shard-*.zarr")))
    target = results / "demo/target"
    trained = results / "drafter/vllm"
    common = {"heldout_fraction": args.heldout_fraction}
    offline = offline_acceptance(trained, shards, target, ks=[args.k], **common)["by_k"]
    offline = offline[str(args.k)]
    served = {}
    with tempfile.TemporaryDirectory() as tmp:
        untrained = Path(tmp) / "untrained"
        untrained_export(trained, untrained)
        for name, export in (("trained", trained), ("untrained", untrained)):
            served[name] = serving_acceptance(
                export, shards, target, k=args.k, max_tokens=args.max_tokens,
                max_model_len=1024, max_prompts=args.prompts, compare_plain=name == "trained",
                **common,
            )  # fmt: skip
    print(f"| K={args.k} | mean acceptance length |\n|---|---|")
    rows = {
        "offline, drafts before the end of the answer": offline["mean_acceptance_length"],
        "offline, drafts past the end counted accepted": offline["mean_acceptance_length_upper"],
    }
    rows.update(
        {f"served in vLLM, {n} drafter": r["mean_acceptance_length"] for n, r in served.items()}
    )
    for name, value in rows.items():
        print(f"| {name} | {value:.3f} |")
    speed = served["trained"]["tokens_per_s"]
    print(
        f"output tokens/s without / with the drafter: {speed['without_drafter']:.0f} / "
        f"{speed['with_drafter']:.0f}; identical greedy outputs "
        f"{served['trained']['identical_outputs']}/{served['trained']['prompts']}"
    )
    if args.json:
        figures = {
            "k": args.k,
            "offline_mean_acceptance_length": offline["mean_acceptance_length"],
            "offline_mean_acceptance_length_upper": offline["mean_acceptance_length_upper"],
            "served_trained_mean_acceptance_length": served["trained"]["mean_acceptance_length"],
            "served_untrained_mean_acceptance_length": served["untrained"][
                "mean_acceptance_length"
            ],
            "tokens_per_s_without_drafter": speed["without_drafter"],
            "tokens_per_s_with_drafter": speed["with_drafter"],
            "identical_outputs": served["trained"]["identical_outputs"],
            "prompts": served["trained"]["prompts"],
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
