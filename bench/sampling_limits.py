"""Served with the sampling users serve with: temperature, top_p and top_k together.

vLLM truncates the target's tempered distribution by a request's top_k and top_p before it
accepts drafts (eagleflow/sampled.py). For each setting (default: Kimi-K2.5's thinking mode,
T=1.0 with top_p 0.95, and Qwen3's, T=0.6 with top_p 0.95 and top_k 20) the exported drafter
is served in vLLM with those limits, next to the offline estimate with and without them, and
the losslessness check compares the target's log-likelihood of the outputs sampled with the
drafter and without it (same limits, same seeds).

    .venv/bin/python bench/sampling_limits.py --results results --setting 1.0,0.95,0 0.6,0.95,20
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

from draft_sampling import lossless_row
from rows import Row, finish, output_arguments, served_prompts_arguments

SETTINGS = ["1.0,0.95,0", "0.6,0.95,20"]


def setting(text: str) -> tuple[float, float, int]:
    """`T,top_p,top_k` as vLLM names them, e.g. 0.6,0.95,20."""
    try:
        t, top_p, top_k = text.split(",")
        parsed = float(t), float(top_p), int(top_k)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: expected T,top_p,top_k") from err
    if parsed[0] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: top_p and top_k apply at T > 0 only")
    return parsed


def table_rows(figures: list[dict]) -> list[Row]:
    from eagleflow.sampling import SamplingLimits

    rows = []
    for f in figures:
        words, k = SamplingLimits.of(f).words(f["temperature"]), f["k"]
        rows.append(Row(
            f"served mean acceptance length, K={k}, {words} (offline with the limits; without)",
            f"{f['served']:.3f} ({f['offline']:.3f}, served {f['served'] / f['offline'] - 1:+.1%};"
            f" {f['offline_untruncated']:.3f})",
            key=f"{words}.served",
        ))  # fmt: skip
        rows.append(lossless_row(f"K={k}, {words}", f["lossless"], f"{words}.lossless"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--export", type=Path, help="drafter export (default: the run's)")
    parser.add_argument("--setting", type=setting, nargs="+", default=[*map(setting, SETTINGS)])
    parser.add_argument("--k", type=int, default=3)
    served_prompts_arguments(parser)
    output_arguments(parser, "sampling_limits")
    args = parser.parse_args()

    from eagleflow.evaluate import offline_acceptance
    from eagleflow.sampling import SamplingLimits
    from eagleflow.serving_check import serving_acceptance

    shards = sorted(glob.glob(str(args.results / "hidden/shard-*.zarr")))
    target = args.results / "demo/target"
    export = args.export or args.results / "drafter/vllm"
    common = dict(heldout_fraction=args.heldout_fraction)
    figures = []
    for t, top_p, top_k in args.setting:
        limits = SamplingLimits(top_k, top_p)
        untruncated = offline_acceptance(
            export, shards, target, ks=[args.k], temperatures=[t], **common
        )["by_temperature"][str(t)]["by_k"][str(args.k)]
        truncated = offline_acceptance(
            export, shards, target, ks=[args.k], temperatures=[t], limits=limits, **common
        )["by_temperature"][str(t)]["by_k"][str(args.k)]  # fmt: skip
        served = serving_acceptance(
            export, shards, target, k=args.k, max_tokens=args.max_tokens, max_model_len=1024,
            max_prompts=args.prompts, temperatures=[t], limits=limits, **common,
        )  # fmt: skip
        figures.append({
            "temperature": t, **limits.as_dict(), "k": args.k,
            "served": served["mean_acceptance_length"],
            "offline": truncated["mean_acceptance_length"],
            "offline_untruncated": untruncated["mean_acceptance_length"],
            "lossless": served["lossless"],
        })  # fmt: skip
        print(figures[-1], flush=True)
    finish(args, "Served with top_p and top_k", table_rows(figures), figures)


if __name__ == "__main__":
    main()
