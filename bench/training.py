"""Training input and training speed, side by side in one run.

  (a) our loader: zarr shards streamed by worker processes (eagleflow.loader), the batches the
      trainer sees;
  (b) a per-sample loader: the same samples saved one `.pt` file each (bf16 tensors, as the
      EAGLE reference scripts and SpecForge's offline mode store them) and read with
      `torch.load`, same batches, same workers, same collation;
  (c) training steps/s of the drafter on these batches (forward, TTT, backward, AdamW).
Prints tokens/s of (a) and (b) and their ratio (goal a/b >= 3), then steps/s and tokens/s of (c).

The data is `--copies` copies of the demo shards, and the loaders read one epoch of it, so that
every sample is read once, as in a run over a dataset far larger than memory, and no loader is
helped by a cache of decoded chunks. Each loader is timed twice: warm (files in the page cache:
the ratio measures decode and per-file overhead) and cold (both datasets evicted from the page
cache first, as for the 830 GB reference case). Throughput is the steady state, from the first
batch delivered to the last, as over a long training run; the time to the first batch (worker
start-up, opening the shards) is printed beside it. The goal applies to the cold ratio.
This machine is shared and noisy (the per-sample loader alone moved 2x between runs), so the
loaders are timed in `--rounds` rounds, their order alternating, and the medians are printed with
each round's ratio.

    .venv/bin/python bench/training.py --results results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from statistics import median

import torch
from rows import Row, finish, goal_row, joined, output_arguments
from torch.utils.data import DataLoader, Dataset

from eagleflow.loader import epoch_batches, list_samples, make_loader, pad_batch, window_tokens
from eagleflow.shards import open_shard

GOAL_LOADER_RATIO = 3.0  # cold page cache


class PerSampleFiles(Dataset):
    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        return torch.load(self.files[i], weights_only=True)


def write_per_sample(shards: list[str], refs, out: Path) -> list[Path]:
    files = []
    opened = {}
    for n, ref in enumerate(refs):
        shard = opened.setdefault(ref.shard, open_shard(shards[ref.shard]))
        path = out / f"sample-{n:06d}.pt"
        torch.save(shard.sample(ref.index), path)
        files.append(path)
    return files


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (written back first, or dirty pages stay)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drain(loader) -> tuple[float, float, int]:
    """Seconds to the first batch, then seconds and padded tokens from it to the last batch."""
    start, tokens, first = time.perf_counter(), 0, None
    for batch in loader:
        if first is None:
            first = time.perf_counter()
            continue
        tokens += int(batch["loss_mask"].shape[0] * batch["loss_mask"].shape[1])
    return first - start, time.perf_counter() - first, tokens


def copy_shards(shards: list[str], copies: int, out: Path) -> list[str]:
    """`copies` copies of every shard, so that one epoch is long enough to time."""
    paths = []
    for c in range(copies):
        for n, shard in enumerate(shards):
            paths.append(str(shutil.copytree(shard, out / f"shard-{c}{n:05d}.zarr")))
    return paths


def train_run(
    results: Path,
    shards: list[str],
    steps: int,
    batch_tokens: int,
    env: dict | None = None,
    prelude: str = "",
) -> tuple[float, list[float]]:
    """Train the drafter for `steps` on `shards` as the train job does, with `env` added to the
    environment and the Python statements `prelude` run before the trainer starts; (seconds,
    with start-up and export, and tokens/s of each logged window)."""
    from eagleflow.train import TrainSettings

    with tempfile.TemporaryDirectory() as tmp:
        settings = TrainSettings(
            shards=shards, vocab=str(results / "vocab/vocab.safetensors"),
            target=str(results / "demo/target"), out_vllm=f"{tmp}/vllm",
            out_speculators=f"{tmp}/spec", metrics=f"{tmp}/metrics.tsv",
            checkpoint_dir=f"{tmp}/ckpt", steps=steps,
            batch_tokens=batch_tokens, eval_every=0, checkpoint_every=10**9,
        )  # fmt: skip
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(json.dumps(asdict(settings)))
        # A process of its own, as the train job has: run in this process, after the loaders,
        # steps took 14.7 s instead of ~0.35 s (cause not pinned down; torch's thread pool
        # started before train_drafter sets its thread-wide denormal flush is a suspect).
        start = time.perf_counter()
        command = [sys.executable, "-m", "eagleflow.train", str(settings_file)]
        if prelude:
            trainer = f"from eagleflow.train import main\nmain([{str(settings_file)!r}])"
            command = [sys.executable, "-c", f"{prelude}\n{trainer}"]
        subprocess.run(command, check=True, env=os.environ | (env or {}))
        seconds = time.perf_counter() - start
        lines = Path(settings.metrics).read_text().splitlines()
    rates = [float(line.split("\t")[4]) for line in lines[1:] if "\ttrain\t" in line]
    return seconds, rates


def table_rows(f: dict) -> list[Row]:
    return [
        Row("loader data: one epoch over copies of the demo shards, batches, workers; rounds "
            "(figures below: medians)",
            f"{f['copies']} copies, {f['samples']:,} samples; {f['loader_batches']}; "
            f"{f['workers']}; {f['rounds']}", key="copies"),
        Row("(a) loader, zarr shards (ours), tok/s in steady state, cold / warm page cache",
            f"{f['zarr_loader_cold_tok_s']:,.0f} / {f['zarr_loader_tok_s']:,.0f}",
            key="zarr_loader_cold_tok_s"),
        Row("(b) loader, per-sample torch.load, tok/s in steady state, cold / warm page cache",
            f"{f['per_sample_loader_cold_tok_s']:,.0f} / {f['per_sample_loader_tok_s']:,.0f}",
            key="per_sample_loader_cold_tok_s"),
        Row("seconds to the first batch (worker start-up), (a) / (b), cold",
            f"{f['zarr_loader_first_batch_s']:.2f} / {f['per_sample_loader_first_batch_s']:.2f}",
            key="zarr_loader_first_batch_s"),
        goal_row("loader ratio a / b, cold page cache", f["loader_ratio_cold"], GOAL_LOADER_RATIO,
                 "loader_ratio_cold"),
        Row("loader ratio a / b by round, cold; warm",
            f"{joined(f['loader_ratio_cold_by_round'])}; {joined(f['loader_ratio_by_round'])}",
            key="loader_ratio_cold_by_round"),
        Row("loader ratio a / b, warm page cache", f"{f['loader_ratio']:.2f}", key="loader_ratio"),
        Row(f"(c) training steps/s: steady state; {f['train_steps']} steps with start-up and "
            "export", f"{f['train_steady_steps_per_s']:.2f}; {f['train_steps_per_s']:.2f}",
            key="train_steps_per_s"),
        Row(f"(c) training tok/s in steady state (batch {f['batch_tokens']} tokens)",
            f"{f['train_steady_tok_s']:,.0f}", key="train_steady_tok_s"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--copies", type=int, default=4, help="copies of the demo shards")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="loader timings, medians printed")
    parser.add_argument("--train-steps", type=int, default=30)
    output_arguments(parser, "training")
    args = parser.parse_args()
    results = Path(args.results)
    demo_shards = sorted(str(p) for p in (results / "hidden").glob("shard-*.zarr"))

    with tempfile.TemporaryDirectory() as tmp:
        shards = copy_shards(demo_shards, args.copies, Path(tmp))
        refs = list_samples(shards, 0.0, "train")
        batches = epoch_batches(refs, 0, 0, args.batch_tokens, window_tokens(shards))
        print(f"{len(shards)} shards ({args.copies} copies of the demo's), {len(refs)} samples; "
              f"one epoch: {len(batches)} batches of <= {args.batch_tokens} tokens, "
              f"{args.workers} worker(s)")  # fmt: skip
        (Path(tmp) / "pt").mkdir()
        files = write_per_sample(shards, refs, Path(tmp) / "pt")
        per_sample = DataLoader(
            PerSampleFiles(files),
            batch_sampler=batches,
            collate_fn=pad_batch,
            num_workers=args.workers,
        )
        zarr_files = [p for shard in shards for p in Path(shard).rglob("*") if p.is_file()]
        # rounds[r][cache] = (ours, per-sample), each (s to 1st batch, s, tokens)
        rounds: list[dict[str, tuple]] = []
        for r in range(args.rounds):
            timed = {}
            for cache in ("cold", "warm"):
                if cache == "cold":
                    evict([*zarr_files, *files])
                else:  # page cache warmed by a first pass
                    drain(make_loader(shards, refs, batches, num_workers=args.workers))
                loaders = (make_loader(shards, refs, batches, num_workers=args.workers), per_sample)
                # The order alternates between rounds: drift on a shared machine hits both.
                got = {k: drain(loaders[k]) for k in ((1, 0) if r % 2 else (0, 1))}
                timed[cache] = (got[0], got[1])
            rounds.append(timed)
    caches = ("cold", "warm")
    # rate[cache][k]: tokens/s of loader k (0 ours, 1 per-sample) in each round
    rate = {c: [[t[c][k][2] / t[c][k][1] for t in rounds] for k in (0, 1)] for c in caches}
    startup = {c: [median([t[c][k][0] for t in rounds]) for k in (0, 1)] for c in caches}
    ratios = {c: [a / b for a, b in zip(*rate[c], strict=True)] for c in caches}
    ratio = {c: median(ratios[c]) for c in caches}
    # Two runs of `--train-steps` and twice that: their difference is steps/s in steady state,
    # start-up, the held-out evaluation and the export cancelled out.
    short = train_run(results, demo_shards, args.train_steps, args.batch_tokens)
    long = train_run(results, demo_shards, 2 * args.train_steps, args.batch_tokens)
    steady_steps_s = args.train_steps / (long[0] - short[0])
    figures = {
        "shards": len(shards),
        "samples": len(refs),
        "copies": args.copies,
        "loader_batches": len(batches),
        "batch_tokens": args.batch_tokens,
        "workers": args.workers,
        "rounds": args.rounds,
        "zarr_loader_tok_s": median(rate["warm"][0]),
        "per_sample_loader_tok_s": median(rate["warm"][1]),
        "loader_ratio": ratio["warm"],
        "zarr_loader_cold_tok_s": median(rate["cold"][0]),
        "per_sample_loader_cold_tok_s": median(rate["cold"][1]),
        "loader_ratio_cold": ratio["cold"],
        "loader_ratio_cold_by_round": ratios["cold"],
        "loader_ratio_by_round": ratios["warm"],
        "zarr_loader_first_batch_s": startup["cold"][0],
        "per_sample_loader_first_batch_s": startup["cold"][1],
        "train_steps": args.train_steps,
        "train_seconds": short[0],
        "train_steps_per_s": args.train_steps / short[0],
        "train_steady_steps_per_s": steady_steps_s,
        "train_steady_tok_s": long[1][-1],
    }
    finish(args, "Training input and speed", table_rows(figures), figures)


if __name__ == "__main__":
    main()
