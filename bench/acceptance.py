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
import tempfile
from pathlib import Path

import torch
from rows import Row, finish, output_arguments, served_prompts_arguments

# config.yaml's evaluate.tolerance: the serving check fails a served acceptance this far below
# the offline estimate.
SERVING_TOLERANCE = 0.03


def untrained_export(trained: Path, out: Path) -> None:
    from eagleflow.export import export_vllm, load_drafter

    model, config = load_drafter(trained)
    torch.manual_seed(0)
    fresh = type(model)(model.cfg, model.d2t, model.t2d)
    export_vllm(fresh, config["aux_layer_ids"], out)


def table_rows(f: dict) -> list[Row]:
    k, offline = f["k"], f["offline_mean_acceptance_length"]
    served = f["served_trained_mean_acceptance_length"]
    floor = offline * (1 - SERVING_TOLERANCE)
    speedup = f["tokens_per_s_with_drafter"] / f["tokens_per_s_without_drafter"]
    return [
        Row(f"offline mean acceptance length, K={k}, drafts before the end of the answer",
            f"{offline:.3f}", key="offline_mean_acceptance_length"),
        Row(f"offline, K={k}, drafts past the end counted accepted",
            f"{f['offline_mean_acceptance_length_upper']:.3f}",
            key="offline_mean_acceptance_length_upper"),
        Row(f"served in vLLM, trained drafter, K={k}", f"{served:.3f}",
            f">= offline x {1 - SERVING_TOLERANCE:g} = {floor:.3f} (the serving check)",
            served >= floor, "served_trained_mean_acceptance_length"),
        Row(f"served in vLLM, untrained drafter, K={k} (expected ~1.0)",
            f"{f['served_untrained_mean_acceptance_length']:.3f}",
            key="served_untrained_mean_acceptance_length"),
        Row("served output tok/s without / with the drafter",
            f"{f['tokens_per_s_without_drafter']:,.0f} / {f['tokens_per_s_with_drafter']:,.0f}"
            f" (x{speedup:.2f})", key="tokens_per_s_*"),
        Row("identical greedy outputs with / without the drafter",
            f"{f['identical_outputs']}/{f['prompts']}", key="identical_outputs"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--k", type=int, default=3)
    served_prompts_arguments(parser)
    output_arguments(parser, "acceptance")
    args = parser.parse_args()

    from eagleflow.evaluate import offline_acceptance
    from eagleflow.serving_check import serving_acceptance

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
    speed = served["trained"]["tokens_per_s"]
    figures = {
        "k": args.k,
        "offline_mean_acceptance_length": offline["mean_acceptance_length"],
        "offline_mean_acceptance_length_upper": offline["mean_acceptance_length_upper"],
        "served_trained_mean_acceptance_length": served["trained"]["mean_acceptance_length"],
        "served_untrained_mean_acceptance_length": served["untrained"]["mean_acceptance_length"],
        "tokens_per_s_without_drafter": speed["without_drafter"],
        "tokens_per_s_with_drafter": speed["with_drafter"],
        "identical_outputs": served["trained"]["identical_outputs"],
        "prompts": served["trained"]["prompts"],
    }
    finish(args, "Acceptance", table_rows(figures), figures)


if __name__ == "__main__":
    main()
