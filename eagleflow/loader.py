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

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from eagleflow.shards import ChunkCache, open_shard, raw_bytes_per_token
from eagleflow.split import is_heldout

# Consecutive samples of one shard kept together: about this many bytes of tokens, i.e.
# several chunks, so that few chunks are shared by two windows and decoded twice per epoch.
WINDOW_BYTES = 16 * 2**20
DEFAULT_WINDOW_TOKENS = 3000  # where no shard says how many bytes a token takes (tests)
GROUP_WINDOWS = 8  # windows whose samples are mixed and length-sorted into batches
CACHE_BYTES = 256 * 2**20  # decoded chunks kept per loader worker: a group's chunks fit


@dataclass(frozen=True)
class SampleRef:
    shard: int  # index into the shard list
    index: int  # sample index inside the shard
    num_tokens: int


def list_samples(
    shard_paths: Sequence[str | Path], heldout_fraction: float, split: str
) -> list[SampleRef]:
    """References to the samples of one split ("train" or "heldout"), in shard order."""
    refs = []
    for shard_index, path in enumerate(shard_paths):
        shard = open_shard(path)
        lengths = shard.offsets[1:] - shard.offsets[:-1]
        for i, sample_id in enumerate(shard.sample_ids):
            if is_heldout(sample_id, heldout_fraction) == (split == "heldout"):
                refs.append(SampleRef(shard_index, i, int(lengths[i])))
    return refs


def window_tokens(shard_paths: Sequence[str | Path]) -> int:
    """Tokens per shuffling window: WINDOW_BYTES of the shards' tokens."""
    attrs = open_shard(shard_paths[0]).attrs
    token_bytes = raw_bytes_per_token(len(attrs["aux_layer_ids"]), attrs["hidden_size"])
    return max(1, WINDOW_BYTES // token_bytes)


def windows(refs: Sequence[SampleRef], tokens: int) -> list[range]:
    """Runs of consecutive samples of one shard holding about `tokens` tokens (at least one
    sample each)."""
    runs: list[range] = []
    start, held = 0, 0
    for i, ref in enumerate(refs):
        if i > start and (held >= tokens or ref.shard != refs[start].shard):
            runs.append(range(start, i))
            start, held = i, 0
        held += ref.num_tokens
    if refs:
        runs.append(range(start, len(refs)))
    return runs


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
    refs: Sequence[SampleRef],
    seed: int,
    epoch: int,
    batch_tokens: int,
    window: int = DEFAULT_WINDOW_TOKENS,
) -> list[list[int]]:
    """One epoch's global batches, the same for every process count.

    Windows of consecutive samples (`window` tokens each, see `window_tokens`) are shuffled
    across all shards; each group of windows is packed into length-sorted batches, shuffled
    within the group. A group's chunks fit in a worker's chunk cache, and a window spans
    several chunks, so each chunk is decoded little more than once per epoch.
    """
    rng = random.Random(f"{seed}:{epoch}")
    runs = windows(refs, window)
    rng.shuffle(runs)
    batches: list[list[int]] = []
    for g in range(0, len(runs), GROUP_WINDOWS):
        group = pack_batches(
            refs, [i for w in runs[g : g + GROUP_WINDOWS] for i in w], batch_tokens
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
        window: int = DEFAULT_WINDOW_TOKENS,
    ) -> None:
        self.refs, self.batch_tokens, self.seed, self.window = refs, batch_tokens, seed, window
        self.start_step, self.num_steps, self.rank, self.world = start_step, num_steps, rank, world

    def global_batches(self) -> Iterator[list[int]]:
        epoch = 0
        while True:
            yield from epoch_batches(self.refs, self.seed, epoch, self.batch_tokens, self.window)
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
        return shard.sample_rows(ref.index)  # views into the chunk cache: pad_batch copies


def _batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor; in a loader worker, allocated in shared memory, as torch's own
    collate does, so that handing the batch to the trainer does not copy it once more."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _as_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A numpy view of `x` (bf16 as its uint16 bit patterns): numpy's per-call overhead is a
    fraction of torch's, which matters for the many small row copies of a batch."""
    if isinstance(x, np.ndarray):
        return x
    return (x.view(torch.uint16) if x.dtype == torch.bfloat16 else x).numpy()


def pad_batch(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples to one [B, T, ...] batch; padding has loss_mask False.

    A sample's arrays are tensors (`Shard.sample`) or stored rows (`Shard.sample_rows`)."""
    if not samples:  # a rank's share of a global batch can be empty
        return {"empty": torch.tensor(True)}
    length = max(len(s["input_ids"]) for s in samples)
    batch, (num_aux, hidden) = len(samples), samples[0]["aux"].shape[1:]
    out = {
        "input_ids": _batch_tensor((batch, length), torch.long),
        "loss_mask": _batch_tensor((batch, length), torch.bool),
        "aux": _batch_tensor((batch, length, num_aux * hidden), torch.bfloat16),
        "last": _batch_tensor((batch, length, hidden), torch.bfloat16),
    }
    rows = {name: _as_numpy(tensor) for name, tensor in out.items()}
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        for name, rows_of in rows.items():
            rows_of[row, :n] = _as_numpy(sample[name]).reshape(n, *rows_of.shape[2:])
            rows_of[row, n:] = 0  # only the padding is zeroed, not the whole batch first
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
