"""Training speed with oneDNN's default kernel cache against the trainer's, side by side.

On CPUs oneDNN compiles a matmul kernel per shape and keeps the last 1,024 (its default). Batches
of whole samples vary in length, so a run needs a few thousand; `train_drafter` raises the cache
to 8,192 (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, unless the environment sets it) and pads the rows of
each chain step's logits to a multiple of 128. This bench trains the default recipe on the demo
shards as the train job does, in a process of its own, with the variable set to 1,024 and with
the trainer's setting, `--rounds` times each, order alternating (this machine is shared and
noisy), and prints tokens/s over the whole run and over its first and last quarter.

    .venv/bin/python bench/kernel_cache.py --results results
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean, median

from rows import Row, finish, joined, output_arguments
from training import train_run

VARIANTS = {"onednn_default": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}, "trainer": {}}


def summary(rates: list[float]) -> dict[str, float]:
    quarter = max(1, len(rates) // 4)
    return {"run": mean(rates), "first": mean(rates[:quarter]), "last": mean(rates[-quarter:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    output_arguments(parser, "kernel_cache")
    args = parser.parse_args()
    shards = sorted(str(p) for p in (args.results / "hidden").glob("shard-*.zarr"))
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            seconds, rates = train_run(
                args.results, shards, args.steps, args.batch_tokens, VARIANTS[name]
            )
            runs[name].append(summary(rates) | {"seconds": seconds})
            print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    med = {n: {k: median(x[k] for x in runs[n]) for k in runs[n][0]} for n in runs}
    base, ours = med["onednn_default"], med["trainer"]
    figures = {
        "steps": args.steps,
        "batch_tokens": args.batch_tokens,
        "rounds": args.rounds,
        "runs": runs,
        "ratio_run": ours["run"] / base["run"],
        "ratio_last_quarter": ours["last"] / base["last"],
    }

    def rates(m: dict) -> str:
        return f"{m['run']:,.0f} ({m['first']:,.0f} / {m['last']:,.0f})"

    rows = [
        Row("training: steps, batch tokens, rounds (medians below)",
            f"{args.steps}, {args.batch_tokens}, {args.rounds}", key="steps"),
        Row("tok/s, oneDNN's default cache of 1,024 kernels: run (first / last quarter)",
            rates(base), key="runs"),
        Row("tok/s, the trainer's cache of 8,192 kernels: run (first / last quarter)",
            rates(ours), key="runs"),
        Row("ratio trainer / default: run; last quarter",
            joined([figures["ratio_run"], figures["ratio_last_quarter"]]), key="ratio_run"),
        Row("train seconds with start-up and export, default / trainer",
            f"{base['seconds']:.0f} / {ours['seconds']:.0f}", key="runs"),
    ]  # fmt: skip
    finish(args, "oneDNN kernel cache and training speed", rows, figures)


if __name__ == "__main__":
    main()
