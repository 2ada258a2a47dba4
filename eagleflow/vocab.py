"""Draft vocabulary: loss-masked token counts per shard, then the d2t / t2d map and its coverage.

The draft vocab is the `draft_vocab_size` most frequent target ids over loss-masked (assistant)
tokens of the training split, sorted ascending. `d2t[i] = target_id - i` (int64 offsets, the form
vLLM and SGLang read); `t2d` is a bool mask over the target's embedding rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagleflow.files import atomic_output, read_jsonl, write_json
from eagleflow.logs import InputError
from eagleflow.split import is_heldout
from eagleflow.target_config import target_vocab_size

EAGLE3_DRAFT_VOCAB = 32000  # the size EAGLE-3 drafters of large targets use


def resolve_draft_vocab_size(configured: int | None, vocab_rows: int) -> int:
    """The configured size, else 32,000, or half the target's rows for small targets."""
    if configured is None:
        return min(EAGLE3_DRAFT_VOCAB, vocab_rows // 2)
    if not 1 <= configured <= vocab_rows:
        raise InputError(
            f"vocab.draft_vocab_size: {configured} is outside [1, {vocab_rows}] "
            f"(the target has {vocab_rows} embedding rows)"
        )
    return configured


def count_tokens(
    tokens_path: str | Path, vocab_rows: int, heldout_fraction: float
) -> dict[str, np.ndarray]:
    """Loss-masked token counts of one prepared shard, per split ("train", "heldout")."""
    counts = {split: np.zeros(vocab_rows, dtype=np.int64) for split in ("train", "heldout")}
    for line, sample in enumerate(read_jsonl(tokens_path), start=1):
        ids = np.asarray(sample["input_ids"], dtype=np.int64)
        mask = np.asarray(sample["loss_mask"], dtype=bool)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_rows):
            raise InputError(
                f"{tokens_path}:{line}: token id {int(ids.max())} outside the target's "
                f"{vocab_rows} embedding rows"
            )
        split = "heldout" if is_heldout(sample["id"], heldout_fraction) else "train"
        counts[split] += np.bincount(ids[mask], minlength=vocab_rows)
    return counts


def write_counts(out_path: str | Path, counts: dict[str, np.ndarray]) -> None:
    with atomic_output(out_path) as tmp, tmp.open("wb") as out:
        np.savez(out, **counts)


def read_counts(paths: Sequence[str | Path]) -> dict[str, np.ndarray]:
    """Counts summed over shards."""
    total: dict[str, np.ndarray] = {}
    for path in paths:
        with np.load(path) as counts:
            for split in counts.files:
                total[split] = total.get(split, 0) + counts[split]
    return total


def build_vocab_map(train_counts: np.ndarray, draft_vocab_size: int) -> tuple[torch.Tensor, ...]:
    """(d2t, t2d) for the most frequent ids; ties go to the lower id, so the map is stable."""
    # Stable sort of -counts: equal counts keep ascending id order.
    top = np.sort(np.argsort(-train_counts, kind="stable")[:draft_vocab_size])
    draft_ids = torch.from_numpy(top.astype(np.int64))
    d2t = draft_ids - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(len(train_counts), dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


def draft_to_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    return d2t + torch.arange(len(d2t), dtype=d2t.dtype)


def load_vocab_map(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) from a vocab file or a drafter export (a directory with model.safetensors)."""
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"vocab.reuse: {path}: no vocab file or model.safetensors there")
    tensors = load_file(str(file))
    missing = [name for name in ("d2t", "t2d") if name not in tensors]
    if missing:
        raise InputError(f"vocab.reuse: {file} has no {' or '.join(missing)} tensor")
    return tensors["d2t"].to(torch.int64), tensors["t2d"].to(torch.bool)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_rows: int, source: str) -> None:
    """Refuse a map that does not fit this target: it would misalign every lm_head row."""
    if len(t2d) != vocab_rows:
        raise InputError(
            f"{source}: t2d has {len(t2d)} entries but the target has {vocab_rows} embedding rows"
        )
    draft_ids = draft_to_target_ids(d2t)
    ascending = bool((draft_ids[1:] > draft_ids[:-1]).all())
    if not ascending or not torch.equal(t2d.nonzero().flatten(), draft_ids):
        raise InputError(f"{source}: d2t and t2d disagree (draft ids must be t2d's, ascending)")


def coverage(counts: np.ndarray, t2d: torch.Tensor) -> float:
    """Share of loss-masked target tokens that the draft vocab can produce."""
    total = int(counts.sum())
    return float(counts[t2d.numpy()].sum() / total) if total else float("nan")


def build_vocab(
    counts_paths: Sequence[str | Path],
    model_dir: str | Path,
    out_path: str | Path,
    report_path: str | Path,
    *,
    draft_vocab_size: int | None,
    reuse: str | Path | None = None,
) -> dict:
    """Write the vocab file (d2t, t2d, train counts) and its coverage report; return the report."""
    vocab_rows = target_vocab_size(model_dir)
    counts = read_counts(counts_paths)
    if reuse:
        d2t, t2d = load_vocab_map(reuse)
        check_vocab_map(d2t, t2d, vocab_rows, f"vocab.reuse: {reuse}")
    else:
        size = resolve_draft_vocab_size(draft_vocab_size, vocab_rows)
        d2t, t2d = build_vocab_map(counts["train"], size)
    report = {
        "draft_vocab_size": len(d2t),
        "target_vocab_rows": vocab_rows,
        "reused_from": str(reuse) if reuse else None,
        "loss_tokens": {split: int(c.sum()) for split, c in counts.items()},
        "distinct_loss_tokens": {split: int((c > 0).sum()) for split, c in counts.items()},
        "coverage": {split: coverage(c, t2d) for split, c in counts.items()},
    }
    with atomic_output(out_path) as tmp:
        save_file(
            {"d2t": d2t, "t2d": t2d, "train_counts": torch.from_numpy(counts["train"])},
            str(tmp),
        )
    write_json(report_path, report)
    return report
