"""b / a of the extraction against the target's width, side by side in one run.

The extraction's own costs scale with the bytes it captures per token (4 layers x hidden), the
prefill's with the model's FLOPs per token (~hidden^2 x layers). The demo target is tiny
(hidden 128, 8 layers, 1.8 M parameters), so on it the capture weighs the most it ever will.
This bench runs `bench/extraction.py`'s warm pairs (two engines kept running side by side,
pairs of passes back to back, order alternating) on the demo target and on copies of it
widened to each `--hidden` (same layers, tokenizer and head size, random weights: the cost of a
forward pass does not depend on the weights' values), over the same samples, and prints b / a
for each width as a markdown table.

    .venv/bin/python bench/extraction_scaling.py --hidden 256,512
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

from extraction import GOAL_EXTRACT_OVER_PREFILL, warm_pairs
from rows import Row, finish, goal_row, joined, output_arguments


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    count = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, "np") as weights:
            count += sum(math.prod(weights.get_slice(k).get_shape()) for k in weights.keys())
    return count


def widened_target(model_dir: Path, hidden_size: int, out: Path) -> None:
    """Write a random-weight copy of the Llama target `model_dir` widened to `hidden_size`
    (heads and MLP scaled with it) into `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((model_dir / "config.json").read_text())
    scale = hidden_size / config["hidden_size"]
    config.update(
        hidden_size=hidden_size,
        intermediate_size=round(config["intermediate_size"] * scale),
        num_attention_heads=hidden_size // config["head_dim"],
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(out)
    for path in model_dir.iterdir():  # tokenizer, chat template, generation config
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "config.json":
            shutil.copy(path, out / path.name)


def table_rows(f: dict) -> list[Row]:
    """b / a on the demo target and on random-weight copies of it widened (warm pairs)."""
    rows = []
    for i, width in enumerate(f["widths"]):
        target = "random weights" if width["random_weights"] else "the demo target"
        name = f"hidden {width['hidden_size']} ({width['parameters'] / 1e6:.1f} M, {target})"
        rows += [
            Row(
                f"{name}: (a) / (b) tok/s; b - a, us/token; b / a by pair",
                f"{width['warm_prefill_tok_s']:,.0f} / {width['warm_extract_tok_s']:,.0f}; "
                f"{width['extraction_us_per_token']:.1f}; "
                f"{joined(width['extract_over_prefill_warm_by_pair'])}",
                key=f"widths[{i}]",
            ),
            goal_row(
                f"{name}: b / a (median of the pairs)",
                width["extract_over_prefill_warm"],
                GOAL_EXTRACT_OVER_PREFILL,
                f"widths[{i}].extract_over_prefill_warm",
            ),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("results/demo/target"))
    parser.add_argument(
        "--samples", default="results/tokens/shard-00000.jsonl", help="a tokens JSONL"
    )
    parser.add_argument("--hidden", default="256,512", help="widths to compare with the target's")
    parser.add_argument("--warm-pairs", type=int, default=8)
    parser.add_argument("--encode-threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="keep the widened targets here")
    output_arguments(parser, "extraction_scaling")
    args = parser.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    targets = {json.loads((args.model / "config.json").read_text())["hidden_size"]: args.model}
    for hidden in (int(h) for h in args.hidden.split(",")):
        targets[hidden] = work / f"target-{hidden}"
        widened_target(args.model, hidden, targets[hidden])

    figures = []
    for hidden, model in targets.items():
        run = argparse.Namespace(
            model=str(model), warm_pairs=args.warm_pairs, encode_threads=args.encode_threads
        )
        warm = warm_pairs(run, Path(args.samples), work)
        figure = {
            "hidden_size": hidden,
            "parameters": parameter_count(model),
            "random_weights": model != args.model,
            **warm,
            "extraction_us_per_token": 1e6 / warm["warm_extract_tok_s"]
            - 1e6 / warm["warm_prefill_tok_s"],
        }
        figures.append(figure)
    print(f"\nwidened targets: {work}")
    result = {"widths": figures}
    finish(args, "Extraction against the target's width", table_rows(result), result)


if __name__ == "__main__":
    main()
