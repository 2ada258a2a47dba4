"""The report's plots: training curves, acceptance offline vs served, shards, vocab coverage."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from eagleflow.sampling import SamplingLimits
from eagleflow.shards import open_shard


def _rows(path: str | Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def plot_training(metrics_tsv: str | Path, out: str | Path) -> None:
    rows = _rows(metrics_tsv)
    positions = sorted(int(k.split("_")[1]) for k in rows[0] if k.startswith("acc_"))
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("heldout", "o--")):
        part = [r for r in rows if r["split"] == split]
        if not part:
            continue
        steps = [int(r["step"]) for r in part]
        loss_ax.plot(steps, [float(r["loss"]) for r in part], style, label=split)
        for k in positions:
            values = [float(r[f"acc_{k}"]) for r in part if r[f"acc_{k}"]]
            if values:
                acc_ax.plot(steps[-len(values) :], values, style, label=f"{split} acc_{k}")
    loss_ax.set(title="TTT loss (weighted sum over positions)", xlabel="step", yscale="log")
    acc_ax.set(title="accuracy per TTT position", xlabel="step", ylim=(0, 1))
    loss_ax.legend()
    acc_ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_acceptance(serving_json: str | Path, out: str | Path) -> None:
    """Acceptance per draft position, offline and served, at each temperature the serving
    check served (its report holds the offline estimate of each)."""
    serving = json.loads(Path(serving_json).read_text())
    by_temperature = serving.get("by_temperature") or {"0.0": serving}
    k = serving["served"]["k"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(1, k + 1))
    means = []
    for index, (t, record) in enumerate(by_temperature.items()):
        color = f"C{index}"
        estimate, served = record["offline"], record["served"]
        sampling = SamplingLimits.of(served).words(float(t))
        ax.plot(xs, estimate["per_position"], "o-", color=color, label=f"offline, {sampling}")
        ax.plot(xs, served["per_position"], "s--", color=color, label=f"served, {sampling}")
        means.append(
            f"{sampling}: {estimate['mean_acceptance_length']:.2f} / "
            f"{served['mean_acceptance_length']:.2f}"
        )
    ax.set(
        title=f"acceptance per position, K={k}; mean length offline / served: " + ", ".join(means),
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1),
        xticks=xs,
    )
    ax.title.set_fontsize(9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_shards(shard_paths: list[str], benchmarks: Path, out: str | Path) -> None:
    """Compression ratio and tokens/s (over the job's wall time, from `benchmarks`) per shard."""
    names, ratios, rates = [], [], []
    for path in shard_paths:
        shard = open_shard(path)
        names.append(Path(path).stem.removeprefix("shard-"))
        activations = ("aux", "last")
        ratios.append(shard.nbytes_raw(activations) / shard.nbytes_stored(activations))
        bench = benchmarks / f"{Path(path).stem}.tsv"
        seconds = float(_rows(bench)[-1]["s"]) if bench.is_file() else float("nan")
        rates.append(shard.num_tokens / seconds)
    fig, (ratio_ax, rate_ax) = plt.subplots(1, 2, figsize=(11, 4))
    ratio_ax.bar(names, ratios)
    ratio_ax.set(title="compression ratio of activations per shard", xlabel="shard")
    rate_ax.bar(names, rates)
    rate_ax.set(title=f"{benchmarks.name} tokens/s per shard (job wall time)", xlabel="shard")
    for ax in (ratio_ax, rate_ax):
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_vocab(coverage_json: str | Path, out: str | Path) -> None:
    report = json.loads(Path(coverage_json).read_text())
    splits = list(report["coverage"])
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.bar(splits, [report["coverage"][s] for s in splits])
    ax.set(
        title=(
            f"draft vocab coverage of assistant tokens\n({report['draft_vocab_size']} of "
            f"{report['target_vocab_rows']} target ids)"
        ),
        ylim=(min(0.9, *report["coverage"].values()), 1.0),
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_plots(inputs: Mapping, outputs: Mapping, shard_rule: str = "extract") -> None:
    """All report plots from the workflow's files (Snakemake's input/output objects);
    `shard_rule` wrote the shards (extract, or capture in one pass)."""
    plot_training(inputs["metrics"], outputs["training"])
    plot_acceptance(inputs["serving"], outputs["acceptance"])
    benchmarks = Path(inputs["metrics"]).parents[1] / "benchmarks" / shard_rule
    plot_shards(list(inputs["shards"]), benchmarks, outputs["shards"])
    plot_vocab(inputs["coverage"], outputs["vocab"])
