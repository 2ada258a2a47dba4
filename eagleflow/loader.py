"""Training data from zarr shards: streamed, shuffled across shards, bounded memory.

The batches are a pure function of (seed, epoch), never of the number of processes: each epoch
shuffles windows of consecutive samples across all shards, then packs each group of windows
into batches of similar-length samples within a padded-token budget. DDP rank r takes every
world-th sample of each global batch. So one process and N processes see the same global
batches, and a resumed run continues exactly where the killed one stopped (the batch of step s
is known without reading data). Worker processes decode; memory is bounded by the workers'
chunk caches plus workers x prefetch x batch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from eagleflow.shards import ChunkCache, open_shard
from eagleflow.split import is_heldout

WINDOW = 32  # consecutive samples kept together (a few chunks' worth on small targets)
GROUP_WINDOWS = 8  # windows whose samples are mixed and length-sorted into batches
CACHE_BYTES = 256 * 2**20  # decoded chunks kept per loader worker


@dataclass(frozen=True)
class SampleRef:
    shard: int  # index into the shard list
    index: int  # sample index inside the shard
    num_tokens: int


def list_samples(shard_paths: Sequence[str | Path], heldout_fraction: float, split: str):
    """References to the samples of one split ("train" or "heldout"), in shard order."""
    refs = []
    for shard_index, path in enumerate(shard_paths):
        shard = open_shard(path)
        lengths = shard.offsets[1:] - shard.offsets[:-1]
        for i, sample_id in enumerate(shard.sample_ids):
            if is_heldout(sample_id, heldout_fraction) == (split == "heldout"):
                refs.append(SampleRef(shard_index, i, int(lengths[i])))
    return refs


def pack_batches(
    refs: Sequence[SampleRef], indices: Sequence[int], batch_tokens: int
) -> list[list[int]]:
    """Batches of similar-length samples whose padded size (samples x longest) stays within
    `batch_tokens`; a sample longer than the budget gets a batch of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(indices, key=lambda i: refs[i].num_tokens):
        # Ascending lengths: sample i is the longest of the batch so far.
        if current and (len(current) + 1) * refs[i].num_tokens > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def epoch_batches(
    refs: Sequence[SampleRef], seed: int, epoch: int, batch_tokens: int
) -> list[list[int]]:
    """One epoch's global batches, the same for every process count.

    Windows of consecutive samples are shuffled across all shards; each group of windows is
    packed into length-sorted batches, shuffled within the group. A group's chunks fit in a
    worker's chunk cache, so each chunk is decoded about once per epoch.
    """
    rng = random.Random(f"{seed}:{epoch}")
    windows = [range(i, min(i + WINDOW, len(refs))) for i in range(0, len(refs), WINDOW)]
    rng.shuffle(windows)
    batches: list[list[int]] = []
    for g in range(0, len(windows), GROUP_WINDOWS):
        group = pack_batches(
            refs, [i for w in windows[g : g + GROUP_WINDOWS] for i in w], batch_tokens
        )
        rng.shuffle(group)
        batches += group
    return batches


class TrainBatches(Sampler[list[int]]):
    """This rank's part of each global batch, from step `start_step` on, across epochs."""

    def __init__(
        self,
        refs: Sequence[SampleRef],
        *,
        batch_tokens: int,
        seed: int,
        start_step: int = 0,
        num_steps: int,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.refs, self.batch_tokens, self.seed = refs, batch_tokens, seed
        self.start_step, self.num_steps, self.rank, self.world = start_step, num_steps, rank, world

    def global_batches(self) -> Iterator[list[int]]:
        epoch = 0
        while True:
            yield from epoch_batches(self.refs, self.seed, epoch, self.batch_tokens)
            epoch += 1

    def __iter__(self) -> Iterator[list[int]]:
        for step, batch in enumerate(self.global_batches()):
            if step >= self.num_steps:
                return
            if step >= self.start_step:
                yield batch[self.rank :: self.world]

    def __len__(self) -> int:
        return max(0, self.num_steps - self.start_step)


class ShardSamples(Dataset):
    """Map-style view of samples across shards; shards open lazily in each worker process."""

    def __init__(self, shard_paths: Sequence[str | Path], refs: Sequence[SampleRef]) -> None:
        self.shard_paths = [str(p) for p in shard_paths]
        self.refs = list(refs)
        self._open: dict[int, object] = {}
        self._cache: ChunkCache | None = None

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, i: int) -> dict:
        ref = self.refs[i]
        shard = self._open.get(ref.shard)
        if shard is None:
            self._cache = self._cache or ChunkCache(CACHE_BYTES)  # made in the worker process
            shard = self._open[ref.shard] = open_shard(self.shard_paths[ref.shard], self._cache)
        return shard.sample(ref.index)


def pad_batch(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples to one [B, T, ...] batch; padding has loss_mask False."""
    if not samples:  # a rank's share of a global batch can be empty
        return {"empty": torch.tensor(True)}
    length = max(len(s["input_ids"]) for s in samples)
    batch, (num_aux, hidden) = len(samples), samples[0]["aux"].shape[1:]
    out = {
        "input_ids": torch.zeros(batch, length, dtype=torch.long),
        "loss_mask": torch.zeros(batch, length, dtype=torch.bool),
        "aux": torch.zeros(batch, length, num_aux * hidden, dtype=torch.bfloat16),
        "last": torch.zeros(batch, length, hidden, dtype=torch.bfloat16),
    }
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        out["input_ids"][row, :n] = sample["input_ids"]
        out["loss_mask"][row, :n] = sample["loss_mask"]
        out["aux"][row, :n] = sample["aux"].reshape(n, -1)
        out["last"][row, :n] = sample["last"]
    return out


def make_loader(
    shard_paths: Sequence[str | Path],
    refs: Sequence[SampleRef],
    batches: Sampler[list[int]] | Sequence[list[int]],
    *,
    num_workers: int,
) -> DataLoader:
    return DataLoader(
        ShardSamples(shard_paths, refs),
        batch_sampler=batches,
        collate_fn=pad_batch,
        num_workers=num_workers,
        prefetch_factor=2 if num_workers else None,
        persistent_workers=False,
    )
