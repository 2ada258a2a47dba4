"""Logging for workflow jobs: the job's log file and the terminal get the same lines."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def setup_job_logging(
    log_path: str | Path | None, name: str = "eagleflow", *, fresh: bool = True
) -> logging.Logger:
    """Log INFO lines to stderr and, when given, to `log_path` (Snakemake's `log:` file),
    emptied first when `fresh` (a job's subprocess appends to its parent's log instead).

    Progress bars (tqdm) stay on stderr only: a log file full of carriage returns helps nobody.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may reach a model hub at run time
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # tiktoken caches a vocabulary by its path, not its content: a tiktoken.model replaced in
    # place would be read stale. An empty cache directory turns its cache off.
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            Path(log_path).write_text("")
        # Append mode: vLLM's logging setup closes every existing handler, and a closed
        # FileHandler reopens on the next record only when it is not in "w" mode.
        handlers.append(logging.FileHandler(log_path, mode="a"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )
    return logging.getLogger(name)


class InputError(ValueError):
    """Bad user input (file, line, key, layer id): reported as one line, without a traceback."""


@contextlib.contextmanager
def log_job_errors(log: logging.Logger) -> Iterator[None]:
    """Report an InputError as one clear log line, any other error with its traceback, in the
    job's log file (where Snakemake points the user) as well as on stderr, and exit 1."""
    try:
        yield
    except InputError as err:
        log.error("%s", err)
        sys.exit(1)
    except Exception:
        log.exception("job failed")
        sys.exit(1)
