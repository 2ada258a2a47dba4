"""Training input and training speed, side by side in one run.

  (a) our loader: zarr shards streamed by worker processes (eagleflow.loader), the batches the
      trainer sees;
  (b) a per-sample loader: the same samples saved one `.pt` file each (bf16 tensors, as the
      EAGLE reference scripts and SpecForge's offline mode store them) and read with
      `torch.load`, same batches, same workers, same collation;
  (c) training steps/s of the drafter on these batches (forward, TTT, backward, AdamW).
Prints tokens/s of (a) and (b) and their ratio (goal a/b >= 3), then steps/s and tokens/s of (c).
Each loader is timed twice: warm (files in the page cache: the ratio measures decode and
per-file overhead) and cold (both datasets evicted from the page cache first, as for a dataset
far larger than memory, e.g. the 830 GB reference case: the zarr side reads ~1.6x fewer bytes
from far fewer files). The goal applies to the cold ratio.

    .venv/bin/python bench/training.py --results results --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from eagleflow.loader import TrainBatches, list_samples, make_loader, pad_batch
from eagleflow.shards import open_shard


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


def drain(loader, steps: int) -> tuple[float, int]:
    start, tokens = time.perf_counter(), 0
    for n, batch in enumerate(loader):
        tokens += int(batch["loss_mask"].shape[0] * batch["loss_mask"].shape[1])
        if n + 1 >= steps:
            break
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = Path(args.results)
    shards = sorted(str(p) for p in (results / "hidden").glob("shard-*.zarr"))
    refs = list_samples(shards, 0.0, "train")
    batches = list(TrainBatches(refs, batch_tokens=args.batch_tokens, seed=0, num_steps=args.steps))
    used = sorted({i for batch in batches for i in batch})
    print(f"{len(shards)} shards, {len(refs)} samples; {args.steps} batches of "
          f"<= {args.batch_tokens} tokens, {args.workers} worker(s)")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        files = write_per_sample(shards, [refs[i] for i in used], Path(tmp))
        index = {i: n for n, i in enumerate(used)}
        per_sample = DataLoader(
            PerSampleFiles(files),
            batch_sampler=[[index[i] for i in batch] for batch in batches],
            collate_fn=pad_batch,
            num_workers=args.workers,
        )
        zarr_files = [p for shard in shards for p in Path(shard).rglob("*") if p.is_file()]
        timed = {}
        for cache in ("cold", "warm"):
            if cache == "cold":
                evict([*zarr_files, *files])
            else:  # worker start-up and page cache warmed by a first pass
                drain(make_loader(shards, refs, batches[:2], num_workers=args.workers), 2)
            zarr_loader = make_loader(shards, refs, batches, num_workers=args.workers)
            timed[cache] = (drain(zarr_loader, args.steps), drain(per_sample, args.steps))
    print("| loader | cold cache tokens/s | warm cache tokens/s |\n|---|---|---|")
    rate = {c: [tokens / s for s, tokens in timed[c]] for c in timed}
    print(f"| (a) zarr shards (ours) | {rate['cold'][0]:,.0f} | {rate['warm'][0]:,.0f} |")
    print(f"| (b) per-sample torch.load | {rate['cold'][1]:,.0f} | {rate['warm'][1]:,.0f} |")
    ratio = {c: rate[c][0] / rate[c][1] for c in rate}
    print(f"ratio a/b: cold {ratio['cold']:.2f} (goal >= 3), warm {ratio['warm']:.2f}")

    from eagleflow.train import TrainSettings

    with tempfile.TemporaryDirectory() as tmp:
        settings = TrainSettings(
            shards=shards, vocab=str(results / "vocab/vocab.safetensors"),
            target=str(results / "demo/target"), out_vllm=f"{tmp}/vllm",
            out_speculators=f"{tmp}/spec", metrics=f"{tmp}/metrics.tsv",
            checkpoint_dir=f"{tmp}/ckpt", steps=args.train_steps,
            batch_tokens=args.batch_tokens, eval_every=0, checkpoint_every=10**9,
        )  # fmt: skip
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(json.dumps(asdict(settings)))
        # A process of its own, as the train job has: run in this process, after the loaders
        # above, steps took 14.7 s instead of ~0.35 s (cause not pinned down; torch's thread
        # pool started before train_drafter sets its thread-wide denormal flush is a suspect).
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "eagleflow.train", str(settings_file)], check=True)
        seconds = time.perf_counter() - start
        lines = Path(settings.metrics).read_text().splitlines()
    rates = [float(line.split("\t")[4]) for line in lines[1:] if "\ttrain\t" in line]
    print(
        f"(c) training: {args.train_steps / seconds:.2f} steps/s including start-up and export;"
        f" {rates[-1]:,.0f} tokens/s in steady state (batch {args.batch_tokens} tokens)"
    )
    if args.json:
        figures = {
            "shards": len(shards),
            "samples": len(refs),
            "loader_steps": args.steps,
            "batch_tokens": args.batch_tokens,
            "workers": args.workers,
            "zarr_loader_tok_s": rate["warm"][0],
            "per_sample_loader_tok_s": rate["warm"][1],
            "loader_ratio": ratio["warm"],
            "zarr_loader_cold_tok_s": rate["cold"][0],
            "per_sample_loader_cold_tok_s": rate["cold"][1],
            "loader_ratio_cold": ratio["cold"],
            "train_steps": args.train_steps,
            "train_seconds": seconds,
            "train_steps_per_s": args.train_steps / seconds,
            "train_steady_tok_s": rates[-1],
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
