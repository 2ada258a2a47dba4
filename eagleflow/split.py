"""The deterministic held-out split, shared by the vocab counts, the loader and evaluation."""

from __future__ import annotations

import hashlib


def is_heldout(sample_id: str, fraction: float) -> bool:
    """Whether a sample belongs to the held-out split.

    Decided by a hash of the sample id alone, so a sample stays on its side whatever the shard
    layout, the number of shards done or the number of training processes.
    """
    digest = hashlib.sha256(f"heldout:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
