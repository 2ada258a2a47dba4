"""Training speed with torch's Muon against Float32Muon, side by side, where bf16 is emulated.

torch.optim.Muon runs its Newton-Schulz iteration in bf16. A CPU without AVX512-BF16 or AMX
emulates bf16 matmuls, so there the trainer uses eagleflow.recipe.Float32Muon: the same update
in float32. This bench trains the default recipe on the demo shards as the train job does, in a
process of its own, once with torch's Muon in Float32Muon's place and once as the trainer picks
(float32 iteration without native bf16, torch's with it), `--rounds` times each, order
alternating (the machine is shared and noisy), and prints tokens/s and the ratio. That the
update is torch's, within bf16's rounding, is tests/test_drafter.py's
`test_float32_muon_steps_as_torchs_muon_does_with_a_float32_iteration`.

    .venv/bin/python bench/muon.py --results results
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean, median

from rows import Row, finish, joined, output_arguments
from training import train_run

from eagleflow.precision import native_bf16

# Statements run before the trainer: torch's Muon wherever the trainer would take Float32Muon.
TORCH_MUON = "import torch, eagleflow.recipe as r\nr.Float32Muon = torch.optim.Muon"
VARIANTS = {"torch_muon": TORCH_MUON, "trainer": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    output_arguments(parser, "muon")
    args = parser.parse_args()
    shards = sorted(str(p) for p in (args.results / "hidden").glob("shard-*.zarr"))
    tok_s: dict[str, list[float]] = {name: [] for name in VARIANTS}
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        for name in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            took, rates = train_run(
                args.results, shards, args.steps, args.batch_tokens, prelude=VARIANTS[name]
            )
            tok_s[name].append(mean(rates[1:]))  # logged windows after the first (start-up)
            seconds[name].append(took)
            print(f"round {r + 1} {name}: {tok_s[name][-1]:,.0f} tok/s, {took:.0f} s", flush=True)
    ratios = [a / b for a, b in zip(tok_s["trainer"], tok_s["torch_muon"], strict=True)]
    figures = {
        "steps": args.steps,
        "batch_tokens": args.batch_tokens,
        "rounds": args.rounds,
        "native_bf16": native_bf16("cpu"),
        "tok_s": tok_s,
        "seconds": seconds,
        "ratio": median(ratios),
        "ratios": ratios,
    }
    iteration = "torch's (bf16, native)" if figures["native_bf16"] else "Float32Muon (float32)"
    rows = [
        Row("training: steps, batch tokens, rounds (medians below); this CPU's bf16",
            f"{args.steps}, {args.batch_tokens}, {args.rounds}; "
            f"{'native' if figures['native_bf16'] else 'emulated'}", key="native_bf16"),
        Row("tok/s, torch's Muon (bf16 iteration)", f"{median(tok_s['torch_muon']):,.0f}",
            key="tok_s"),
        Row(f"tok/s, the trainer's Muon: {iteration}", f"{median(tok_s['trainer']):,.0f}",
            key="tok_s"),
        Row("ratio trainer / torch's Muon (per round)",
            f"{figures['ratio']:.2f} ({joined(ratios)})", key="ratio"),
        Row("train seconds with start-up and export, torch's Muon / trainer",
            f"{median(seconds['torch_muon']):.0f} / {median(seconds['trainer']):.0f}",
            key="seconds"),
    ]  # fmt: skip
    finish(args, "Muon's iteration where bf16 is emulated: training speed", rows, figures)


if __name__ == "__main__":
    main()
