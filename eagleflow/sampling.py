"""How a sampled request truncates the target's distribution, by vLLM's names: `top_k`, then
`top_p` (vLLM's `apply_top_k_top_p`). Light (no torch): the rules read it at parse time."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingLimits:
    """`top_k` (0: every token) and `top_p` (1.0: all the mass); both apply at T > 0 only."""

    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def of(cls, record: Mapping[str, Any] | Any) -> SamplingLimits:
        """From anything that holds them by name (a config section, a rule's params, a report);
        a missing one limits nothing, nor does top_k -1 (vLLM accepts it for 0)."""
        top_k = max(int(record.get("top_k", cls.top_k)), 0)
        return cls(top_k, float(record.get("top_p", cls.top_p)))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def limiting(self) -> dict[str, Any]:
        """Only the values that limit sampling (empty: unlimited)."""
        limits = {"top_k": self.top_k} if self.top_k > 0 else {}
        return limits | ({"top_p": self.top_p} if self.top_p < 1 else {})

    def words(self, temperature: float) -> str:
        """`T=1, top_p 0.95, top_k 20`: a sampling setting in words (limits where they apply)."""
        words = [f"T={temperature:g}"]
        if temperature > 0 and self.top_p < 1:
            words.append(f"top_p {self.top_p:g}")
        if temperature > 0 and self.top_k > 0:
            words.append(f"top_k {self.top_k}")
        return ", ".join(words)


UNLIMITED = SamplingLimits()
