"""How a sampled request truncates the target's distribution, by vLLM's names: `top_k`, then
`top_p` (vLLM's `apply_top_k_top_p`). Light (no torch): the rules read it at parse time."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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


def sampled_as_data(
    temperature: float, limits: SamplingLimits, data_temperature: float, data_limits: SamplingLimits
) -> bool:
    """Whether serving at `temperature` with `limits` samples as the training data were
    sampled, the one setting whose contexts the offline estimate walks (limits matter at T > 0
    only): where the serving check gates acceptance."""
    return temperature == data_temperature and (temperature == 0 or limits == data_limits)


def data_sampling_unserved(
    temperatures: Sequence[float],
    limits: SamplingLimits,
    data_temperature: float,
    data_limits: SamplingLimits,
) -> str | None:
    """Why serving at `temperatures` with `limits` gates no acceptance figure (none samples as
    the data were sampled), naming the keys and the fix; None when one does. Such a serving
    check would pass every drafter on acceptance."""
    temperatures = [float(t) for t in temperatures]
    if any(sampled_as_data(t, limits, data_temperature, data_limits) for t in temperatures):
        return None
    fixes = []
    if data_temperature not in temperatures:
        fixes.append(f"add {data_temperature:g} to evaluate.temperatures")
    if not sampled_as_data(data_temperature, limits, data_temperature, data_limits):
        fixes.append("set evaluate.top_k / top_p as generation's")
    return (
        f"evaluate.temperatures: {temperatures}, with evaluate.top_k / top_p {limits.top_k} / "
        f"{limits.top_p:g}, leave out the training data's sampling, "
        f"{data_limits.words(data_temperature)} (generation.temperature, top_k, top_p): the "
        f"serving check would gate no acceptance figure; {' and '.join(fixes)}"
    )
