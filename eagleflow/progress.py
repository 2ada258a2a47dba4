"""The one progress bar of long jobs: items done with ETA (tqdm), plus tokens/s."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

# The bar stays on stderr; every this many seconds its line also goes to the job's log (which
# Snakemake points the user to), so an hours-long job's log says how far it is.
LOG_EVERY_S = 300.0
log = logging.getLogger("eagleflow.progress")


class TokenProgress:
    """A tqdm bar over items (samples, prompts, steps) that also shows tokens/s since it began."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar
        self.tokens = 0
        self.figures: dict[str, Any] = {}
        self.logged_at = time.monotonic()

    def advance(self, items: int, tokens: int, **postfix: Any) -> None:
        """`items` more done, `tokens` more processed; `postfix` sets figures shown until
        replaced (loss=...)."""
        self.tokens += tokens
        self.figures.update(postfix)
        rate = self.tokens / max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.set_postfix(**self.figures, tok_s=f"{rate:.0f}", refresh=False)
        self.bar.update(items)
        now = time.monotonic()
        if not self.bar.disable and now - self.logged_at >= LOG_EVERY_S:
            self.logged_at = now
            log.info("%s", self.bar)


@contextlib.contextmanager
def token_progress(
    total: int, desc: str, unit: str = "sample", *, initial: int = 0, disable: bool = False
) -> Iterator[TokenProgress]:
    """`with token_progress(n, "extract (vllm)") as progress: progress.advance(1, tokens)`."""
    with tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        disable=disable,
        dynamic_ncols=True,
        # Not a terminal (a SLURM job's output file): a line every 30 s, not every second.
        mininterval=1.0 if sys.stderr.isatty() else 30.0,
    ) as bar:
        yield TokenProgress(bar)
