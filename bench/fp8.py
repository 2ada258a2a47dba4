"""Lossy fp8 shards (`extract.codec: fp8-e4m3`) against the lossless default, on a finished run.

A copy of the finished run (`--reference`, extracted with a lossless codec) is switched to
fp8 storage and run again by the workflow itself: every extract job, the drafter's training
(same seed, steps and samples: only the shards differ) and both evaluations, the served one in
vLLM. Side by side it prints:
  - stored bytes per token of the activations against raw bf16 (goal for fp8: <= 0.40);
  - the reconstruction error of every stored layer, ||fp8 - bf16|| / ||bf16|| per sample
    (mean and max over samples; `eagleflow.compare`);
  - the held-out acceptance rate of the first draft position, offline and served mean
    acceptance length of the two drafters (goal: fp8 served within 1% of lossless);
  - why a scale per channel (per chunk) rather than per token: the error of both on the
    reference's first shard as it is, and with massive activations planted as real LLMs carry
    them (two channels of each sample's first token at 1e5x the layer's median magnitude; the
    demo target has none): over all values, over the other channels of those tokens, and over
    those channels in the other tokens.

    .venv/bin/python bench/fp8.py --reference /path/to/run --workdir /tmp/fp8 --json out.json
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from rows import REPO, Row, finish, finished_run, output_arguments

sys.path.insert(0, str(REPO))

from eagleflow.compare import compare_shards
from eagleflow.shards import open_shard, uint16_to_bf16
from eagleflow.shards.fp8 import E4M3_MAX, dequantize, quantize
from tests.faults import planned_shards, snakemake

CODEC = "fp8-e4m3"
# Issue 23: fp8 shards at most 0.40 of raw bf16, and at most 1% less served acceptance.
GOAL_STORED_OVER_RAW = 0.40
GOAL_SERVED_DROP = 0.01
# Made again from the shards in the copy: a resumed checkpoint would skip the training.
RECOMPUTED = ("results/hidden", "results/checkpoints", "results/drafter", "results/eval")


def storage(run: Path) -> dict:
    """Activation bytes per token stored and raw (bf16), over all shards of `run`."""
    tokens = stored = raw = 0
    for shard in planned_shards(run):
        s = open_shard(run / f"results/hidden/shard-{shard}.zarr")
        tokens += s.num_tokens
        stored += s.nbytes_stored(("aux", "last"))
        raw += s.nbytes_raw(("aux", "last"))
    return {
        "codec": s.attrs["codec"],
        "tokens": tokens,
        "stored_bytes_per_token": round(stored / tokens, 2),
        "raw_bytes_per_token": round(raw / tokens, 2),
        "stored_over_raw": round(stored / raw, 4),
    }


def reconstruction(fp8_run: Path, reference: Path) -> dict:
    """Relative error of every stored layer: mean over samples (weighted by samples per shard)
    and the worst sample."""
    samples, mean, worst = 0, {}, {}
    for shard in planned_shards(reference):
        path = f"results/hidden/shard-{shard}.zarr"
        c = compare_shards(fp8_run / path, reference / path, tolerance=1.0)
        if c.ids_differ:
            raise RuntimeError(f"{path}: token ids differ between the runs: {c.ids_differ[:3]}")
        for layer, error in c.mean_relative_error.items():
            mean[layer] = mean.get(layer, 0.0) + error * c.samples_compared
            worst[layer] = max(worst.get(layer, 0.0), c.max_relative_error[layer])
        samples += c.samples_compared
    return {
        "samples": samples,
        "mean_relative_error": {k: round(v / samples, 5) for k, v in mean.items()},
        "max_relative_error": {k: round(v, 5) for k, v in worst.items()},
    }


def drafter(run: Path) -> dict:
    """What the run's own evaluations measured, and its training time."""
    offline = json.loads((run / "results/eval/offline.json").read_text())
    served = json.loads((run / "results/eval/serving.json").read_text())
    with open(run / "results/benchmarks/train.tsv") as rows:
        seconds = float(next(csv.DictReader(rows, delimiter="\t"))["s"])
    k = served["served"]["k"]
    estimate = offline["by_k"][str(k)]
    return {
        "k": k,
        "offline_first_position_rate": round(estimate["per_position"][0], 4),
        "offline_mean_acceptance_length": round(estimate["mean_acceptance_length"], 4),
        "served_mean_acceptance_length": round(served["served"]["mean_acceptance_length"], 4),
        "served_per_position": [round(x, 4) for x in served["served"]["per_position"]],
        "train_seconds": round(seconds, 1),
    }


def per_token_roundtrip(values: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3 with one scale per token and layer (the alternative not chosen)."""
    scale = values.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / E4M3_MAX
    codes = (values / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (codes.float() * scale).bfloat16().float()


def per_channel_roundtrip(values: torch.Tensor, rows: int) -> torch.Tensor:
    """fp8 e4m3 as the codec stores it: a scale per channel per chunk of `rows` tokens."""
    bits = values.bfloat16().view(torch.uint16).numpy()
    out = np.empty_like(bits)
    for start in range(0, len(bits), rows):
        out[start : start + rows] = dequantize(*quantize(bits[start : start + rows]))
    return torch.from_numpy(out).view(torch.bfloat16).float()


def granularity(reference: Path) -> dict:
    """Relative error of per-channel vs per-token scales on `aux` of the first shard, as it is
    and with massive activations planted (see the module docstring)."""
    shard = open_shard(reference / f"results/hidden/shard-{planned_shards(reference)[0]}.zarr")
    rows = shard.arrays["aux"].chunks[0]
    clean = uint16_to_bf16(shard.arrays["aux"][:]).float()  # [T, A, H]
    planted = clean.clone()
    firsts = torch.from_numpy(shard.offsets[:-1].astype(np.int64))
    median = clean.abs().median(dim=0).values.median(dim=-1).values  # per layer
    channels = [7, 100]
    for channel in channels:
        planted[firsts, :, channel] = 1e5 * median
    others = torch.ones(clean.shape[-1], dtype=torch.bool)
    others[channels] = False
    rest = torch.ones(len(clean), dtype=torch.bool)
    rest[firsts] = False

    def relative(y: torch.Tensor, x: torch.Tensor) -> float:
        return round(((y - x).norm() / x.norm()).item(), 5)

    result = {}
    for name, x in (("as_is", clean), ("massive_planted", planted)):
        for scheme, y in (("per_channel", per_channel_roundtrip(x, rows)),
                          ("per_token", per_token_roundtrip(x))):  # fmt: skip
            result[f"{name}.{scheme}"] = {
                "all_values": relative(y, x),
                "other_channels_of_first_tokens": relative(
                    y[firsts][..., others], x[firsts][..., others]
                ),
                "planted_channels_of_other_tokens": relative(
                    y[rest][..., channels], x[rest][..., channels]
                ),
            }
    return result


def table_rows(f: dict) -> list[Row]:
    s, d, r = f["storage"], f["drafter"], f["reconstruction"]
    layers = ", ".join(
        f"{layer} {r['mean_relative_error'][layer]:.4f} ({r['max_relative_error'][layer]:.4f})"
        for layer in r["mean_relative_error"]
    )
    k = d["fp8"]["k"]
    granularity = f["scale_granularity"]
    return [
        Row("stored / raw bf16 bytes per token of the activations: lossless; fp8",
            f"{s['lossless']['stored_over_raw']:.3f} ({s['lossless']['codec']}); "
            f"{s['fp8']['stored_over_raw']:.3f}",
            f"fp8 <= {GOAL_STORED_OVER_RAW:g}", s["fp8"]["stored_over_raw"] <= GOAL_STORED_OVER_RAW,
            "storage"),
        Row(f"relative error per layer, mean (max) over {r['samples']} samples", layers,
            key="reconstruction"),
        Row(f"offline mean acceptance length K={k}: lossless; fp8",
            f"{d['lossless']['offline_mean_acceptance_length']:.3f}; "
            f"{d['fp8']['offline_mean_acceptance_length']:.3f}",
            key="drafter.*.offline_mean_acceptance_length"),
        Row(f"served mean acceptance length K={k} (vLLM): lossless; fp8; relative drop",
            f"{d['lossless']['served_mean_acceptance_length']:.3f}; "
            f"{d['fp8']['served_mean_acceptance_length']:.3f}; {f['served_relative_drop']:+.2%}",
            f"drop <= {GOAL_SERVED_DROP:.0%}", f["served_relative_drop"] <= GOAL_SERVED_DROP,
            "served_relative_drop"),
        *(
            Row(f"relative error, per-channel vs per-token scales, {label}: all values; other "
                "channels of the outlier tokens; outlier channels of the other tokens",
                "; ".join(f"{granularity[case + '.per_channel'][part]:.4f} vs "
                          f"{granularity[case + '.per_token'][part]:.4f}"
                          for part in ("all_values", "other_channels_of_first_tokens",
                                       "planted_channels_of_other_tokens")),
                key=f"scale_granularity.{case}")
            for case, label in (("as_is", "as stored"),
                                ("massive_planted", "massive activations planted"))
        ),
        Row("train job, s: lossless; fp8 (same seed, steps, samples)",
            f"{d['lossless']['train_seconds']:,.0f}; {d['fp8']['train_seconds']:,.0f}",
            key="drafter.*.train_seconds"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        type=finished_run(
            "results/eval/offline.json", "results/eval/serving.json", "results/benchmarks/train.tsv"
        ),
        default=".",
        help="a finished run, extracted with a lossless codec",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/eagleflow-fp8"))
    output_arguments(parser, "fp8")
    parser.add_argument(
        "--reuse", action="store_true", help="take the fp8 run already in --workdir (tables only)"
    )
    args = parser.parse_args()

    reference = args.reference
    config = yaml.safe_load((reference / "config.yaml").read_text())
    lossless_codec = (config.get("extract") or {}).get("codec", "shuffle-zstd1")
    if lossless_codec == CODEC:
        sys.exit(f"--reference {reference}: extracted with {CODEC} already; give a lossless run")
    run = args.workdir / "fp8-run"
    if not args.reuse:
        shutil.rmtree(args.workdir, ignore_errors=True)
        shutil.copytree(
            reference,
            run,
            symlinks=True,
            ignore=lambda d, names: [n for n in names if Path(d, n).relative_to(reference)
                                     .as_posix() in RECOMPUTED],
        )  # fmt: skip
        config.setdefault("extract", {})["codec"] = CODEC
        (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        snakemake(run, timeout=4 * 3600)

    result = {
        "storage": {"lossless": storage(reference), "fp8": storage(run)},
        "reconstruction": reconstruction(run, reference),
        "drafter": {"lossless": drafter(reference), "fp8": drafter(run)},
        "scale_granularity": granularity(reference),
    }
    served = {name: d["served_mean_acceptance_length"] for name, d in result["drafter"].items()}
    result["served_relative_drop"] = round(1 - served["fp8"] / served["lossless"], 4)
    result["fp8_stored_over_raw"] = result["storage"]["fp8"]["stored_over_raw"]
    finish(args, "Lossy fp8 storage", table_rows(result), result)


if __name__ == "__main__":
    main()
