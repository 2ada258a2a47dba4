"""What a training run keeps beside it to survive a crash: checkpoints of its exact settings,
data and code, and the live metrics log that a resumed run continues."""

from __future__ import annotations

import csv
import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagleflow.files import atomic_output
from eagleflow.fingerprint import code_digests

if TYPE_CHECKING:
    from eagleflow.recipe import Optimizers, WeightAverage

log = logging.getLogger("eagleflow.checkpoints")
KEEP_CHECKPOINTS = 2


@functools.cache
def training_code() -> dict[str, str]:
    """sha256 of each eagleflow module the trainer imports, and torch's version: a checkpoint
    written by other code is not resumed, and the log names what changed. Read once per
    process: the code that runs, even if the files are edited during a long training."""
    return {**code_digests("eagleflow.train"), "torch": str(torch.__version__)}


def checkpoint_paths(directory: Path) -> list[Path]:
    """The checkpoints in `directory`, oldest first."""
    return sorted(directory.glob("step-*.pt"))


def save_checkpoint(
    directory: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: Optimizers,
    fingerprint: str,
    average: WeightAverage | None = None,
) -> Path:
    state = {
        "step": step,
        "fingerprint": fingerprint,
        "code": training_code(),
        "model": (model.module if hasattr(model, "module") else model).state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    if average is not None:
        state["average"] = average.state_dict()
    path = directory / f"step-{step:07d}.pt"
    with atomic_output(path) as tmp:
        torch.save(state, tmp)
    for old in checkpoint_paths(directory)[:-KEEP_CHECKPOINTS]:
        old.unlink()
    return path


def latest_checkpoint(directory: Path, fingerprint: str) -> dict | None:
    """The newest readable checkpoint of this exact training run, if any."""
    for path in reversed(checkpoint_paths(directory)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a checkpoint cut short is skipped, the older one used
            log.warning("skipping unreadable checkpoint %s: %s", path, err)
            continue
        if state.get("fingerprint") == fingerprint:
            state["path"] = str(path)
            return state
        ours, theirs = training_code(), state.get("code", {})
        changed = sorted(
            name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name)
        )
        reason = (
            f"the training code changed ({', '.join(changed)})"
            if changed
            else "other settings or data"
        )
        log.info("ignoring checkpoint %s: %s", path, reason)
    return None


class MetricsLog:
    """Per-position metrics as TSV: one row per logged step and split."""

    def __init__(self, path: Path, ttt_steps: int, resume_step: int) -> None:
        self.path = path
        self.columns = ["step", "split", "lr", "loss", "tokens_per_s"] + [
            f"{kind}_{k}" for kind in ("loss", "acc") for k in range(ttt_steps)
        ]
        rows = []
        if resume_step and path.is_file():  # keep the rows the resumed run already logged
            with path.open() as f:
                rows = list(csv.DictReader(f, delimiter="\t"))
            rows = [row for row in rows if int(row["step"]) <= resume_step]
        with atomic_output(path) as tmp, tmp.open("w", newline="") as f:  # a crash keeps them
            writer = csv.DictWriter(f, self.columns, delimiter="\t")
            writer.writeheader()
            writer.writerows(rows)

    def write(self, row: dict) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns, delimiter="\t", extrasaction="ignore").writerow(
                {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
            )
