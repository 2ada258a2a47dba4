"""Sampled serving by vLLM's two draft sample methods, side by side in one run.

Serves the exported drafter at a sampling temperature with `draft_sample_method` greedy (vLLM's
default: the drafter's argmax, accepted with the target's probability of it) and
probabilistic (drafts drawn from the drafter's tempered distribution, accepted with
min(1, p/q)), each next to its offline estimate (eagleflow/sampled.py) and with the
losslessness check (the target's log-likelihood of the outputs sampled with the drafter and
without it), at each K. Greedy requests are drafted alike either way, so T = 0 is not served.

    .venv/bin/python bench/draft_sampling.py --results results --ks 3 5 --temperature 1.0
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

from rows import Row, finish, output_arguments, served_prompts_arguments

from eagleflow.sampled import DRAFT_SAMPLE_METHODS as METHODS


def table_rows(f: dict) -> list[Row]:
    t, rows = f["temperature"], []
    for k in f["ks"]:
        by = {m: f["by_method"][m][str(k)] for m in METHODS}
        for m in METHODS:
            served, offline = by[m]["served"], by[m]["offline"]
            rows.append(Row(
                f"served (offline) mean acceptance length, K={k}, T={t:g}, {m} drafts",
                f"{served:.3f} ({offline:.3f}, served {served / offline - 1:+.1%})",
                key=f"by_method.{m}.{k}.served",
            ))  # fmt: skip
        gain = by["probabilistic"]["served"] / by["greedy"]["served"]
        rows.append(Row(f"probabilistic / greedy drafts, served, K={k}, T={t:g}", f"{gain:.3f}"))
    for m in METHODS:
        rows.append(lossless_row(f"T={t:g}, {m} drafts, K={f['ks'][0]}", f["lossless"][m],
                                 f"lossless.{m}"))  # fmt: skip
    return rows


def lossless_row(served_as: str, lossless: dict, key: str) -> Row:
    """The losslessness verdict (eagleflow.sampled.lossless_verdict) of outputs `served_as`."""
    return Row(
        f"target log-likelihood with / without the drafter, {served_as}",
        f"{lossless['loglik_with_drafter']:.3f} / {lossless['loglik_without_drafter']:.3f} "
        f"nats/token (standard error {lossless['stderr']:.3f})",
        "within 4 standard errors", bool(lossless["lossless"]), key,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--export", type=Path, help="drafter export (default: the run's)")
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--temperature", type=float, default=1.0)
    served_prompts_arguments(parser)
    output_arguments(parser, "draft_sampling")
    args = parser.parse_args()
    if args.temperature <= 0:
        parser.error("--temperature: greedy requests are drafted alike by both methods")

    from eagleflow.evaluate import offline_acceptance
    from eagleflow.serving_check import serving_acceptance

    shards = sorted(glob.glob(str(args.results / "hidden/shard-*.zarr")))
    target = args.results / "demo/target"
    export = args.export or args.results / "drafter/vllm"
    t = args.temperature
    by_method: dict[str, dict[str, dict[str, float]]] = {}
    lossless = {}
    for method in METHODS:
        offline = offline_acceptance(
            export, shards, target, heldout_fraction=args.heldout_fraction, ks=args.ks,
            temperatures=[t], draft_sample_method=method,
        )["by_temperature"][str(t)]["by_k"]  # fmt: skip
        for k in args.ks:
            served = serving_acceptance(
                export, shards, target, heldout_fraction=args.heldout_fraction, k=k,
                max_tokens=args.max_tokens, max_model_len=1024, max_prompts=args.prompts,
                temperatures=[t], compare_plain=k == args.ks[0], draft_sample_method=method,
            )  # fmt: skip
            if k == args.ks[0]:
                lossless[method] = served["lossless"]
            by_method.setdefault(method, {})[str(k)] = {
                "served": served["mean_acceptance_length"],
                "offline": offline[str(k)]["mean_acceptance_length"],
            }
            print(f"{method} K={k} T={t:g}: {by_method[method][str(k)]}", flush=True)
    figures = {"temperature": t, "ks": args.ks, "by_method": by_method, "lossless": lossless}
    finish(args, "Sampled serving by draft sample method", table_rows(figures), figures)


if __name__ == "__main__":
    main()
