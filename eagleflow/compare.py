"""Compare two shards of the same samples, e.g. one captured in one pass with the same samples
extracted in a separate pass:

    python -m eagleflow.compare results/hidden/shard-00000.zarr OTHER.zarr [--json]

Samples are matched by id. For each pair: are the token ids identical (one pass stores the ids
the engine generated; a separate pass over re-tokenized text could differ), and, where they
are, how far apart the states are: the relative error ||a - b|| / ||b|| of every aux layer and
of the last layer. bf16 states from two different forward passes (a decode step against a
prefill) differ by rounding, a few thousandths; a wrong layer or a shifted token differs by
far more. Rows a one-pass shard does not hold (its last generated token) are left out.

Two engines that batch or compile differently round bf16 differently, so a greedy answer can
part where the target's two best tokens are nearly tied. With `--target DIR` each sample whose
ids differ is explained: the target's probabilities of the two tokens at the first differing
position, from each shard's own last-layer state before it (the target's final norm and
lm_head); a gap under `NEAR_TIE` in both is a near tie, which is not a fault of either shard.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from eagleflow.drafter import TargetHead, load_target_head
from eagleflow.shards import Shard, open_shard

# Relative error above which two captures of the same tokens are reported as different.
DEFAULT_TOLERANCE = 0.02
# Probability gap of the target's two best tokens under which a greedy pick is a near tie.
NEAR_TIE = 0.05


@dataclass
class ShardComparison:
    samples_compared: int
    only_in_first: int
    only_in_second: int
    identical_ids: int
    ids_differ: list[str] = field(default_factory=list)  # "id: why"
    ids_differ_at_near_ties: int = 0  # of ids_differ, those explained as near ties (--target)
    bit_identical_states: int = 0
    max_relative_error: dict[str, float] = field(default_factory=dict)  # by array / layer id
    mean_relative_error: dict[str, float] = field(default_factory=dict)
    beyond_tolerance: list[str] = field(default_factory=list)  # "id: array error"
    tolerance: float = DEFAULT_TOLERANCE

    @property
    def ok(self) -> bool:
        """Every sample's ids agree, or part at a near tie of the target; every state agrees."""
        unexplained = len(self.ids_differ) - self.ids_differ_at_near_ties
        return not unexplained and not self.beyond_tolerance and self.samples_compared > 0


def _unseen_last_row(shard: Shard) -> bool:
    """Whether the shard's samples may end in a token without states (one-pass capture)."""
    return shard.attrs.get("capture") == "during_generation"


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _why_ids_differ(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], head: TargetHead | None
) -> tuple[str, bool]:
    """Where two samples' ids part and, given the target's head, whether at a near tie."""
    ids_a, ids_b = a["input_ids"], b["input_ids"]
    common = min(len(ids_a), len(ids_b))
    differ = (ids_a[:common] != ids_b[:common]).nonzero()
    if not len(differ):
        return f"{len(ids_a)} vs {len(ids_b)} tokens", False
    first = int(differ[0])
    tokens = int(ids_a[first]), int(ids_b[first])
    why = f"first differing token at position {first} ({tokens[0]} vs {tokens[1]})"
    if head is None or first == 0:
        return why, False
    gaps = []
    for sample in (a, b):
        probs = head.full_logits(sample["last"][first - 1]).float().softmax(-1)
        best_two = set(probs.topk(2).indices.tolist())
        gaps.append(
            float((probs[tokens[0]] - probs[tokens[1]]).abs()) if best_two == set(tokens) else 1.0
        )
    near_tie = max(gaps) < NEAR_TIE
    verdict = "a near tie" if near_tie else "not a near tie"
    return (
        f"{why}: the target's probabilities of the two differ by {gaps[0]:.3g} / {gaps[1]:.3g} "
        f"(from each shard's states; 1 = not its two best): {verdict}",
        near_tie,
    )


def compare_shards(
    first: str | Path,
    second: str | Path,
    tolerance: float = DEFAULT_TOLERANCE,
    target: str | Path | None = None,
) -> ShardComparison:
    """Compare the samples two shards share (see the module docstring); `target`: the target
    model's directory, to explain samples whose ids differ."""
    a, b = open_shard(first), open_shard(second)
    if a.attrs["aux_layer_ids"] != b.attrs["aux_layer_ids"]:
        raise ValueError(
            f"{first} holds aux layers {a.attrs['aux_layer_ids']}, {second} holds "
            f"{b.attrs['aux_layer_ids']}: nothing to compare"
        )
    head = load_target_head(target) if target is not None else None
    index_b = {sample_id: i for i, sample_id in enumerate(b.sample_ids)}
    shared = [(i, index_b[s]) for i, s in enumerate(a.sample_ids) if s in index_b]
    result = ShardComparison(
        samples_compared=len(shared),
        only_in_first=a.num_samples - len(shared),
        only_in_second=b.num_samples - len(shared),
        identical_ids=0,
        tolerance=tolerance,
    )
    names = [*(f"aux layer {k}" for k in a.attrs["aux_layer_ids"]), "last"]
    errors: dict[str, list[float]] = {name: [] for name in names}
    skip_last = _unseen_last_row(a) or _unseen_last_row(b)
    for i, j in shared:
        sa, sb = a.sample(i), b.sample(j)
        sample_id = a.sample_ids[i]
        if not torch.equal(sa["input_ids"], sb["input_ids"]):
            why, near_tie = _why_ids_differ(sa, sb, head)
            result.ids_differ.append(f"{sample_id}: {why}")
            result.ids_differ_at_near_ties += near_tie
            continue
        result.identical_ids += 1
        rows = len(sa["input_ids"]) - skip_last
        arrays_a = [*sa["aux"][:rows].unbind(1), sa["last"][:rows]]
        arrays_b = [*sb["aux"][:rows].unbind(1), sb["last"][:rows]]
        identical = True
        for name, x, y in zip(names, arrays_a, arrays_b, strict=True):
            identical &= torch.equal(x, y)
            error = _relative_error(x, y)
            errors[name].append(error)
            if error > tolerance:
                result.beyond_tolerance.append(f"{sample_id}: {name} {error:.4f}")
        result.bit_identical_states += identical
    for name, values in errors.items():
        if values:
            result.max_relative_error[name] = round(max(values), 6)
            result.mean_relative_error[name] = round(sum(values) / len(values), 6)
    return result


def format_comparison(c: ShardComparison) -> str:
    lines = [
        f"samples compared      {c.samples_compared} (only in first {c.only_in_first}, "
        f"only in second {c.only_in_second})",
        f"identical token ids   {c.identical_ids}/{c.samples_compared}"
        f" (of the others, {c.ids_differ_at_near_ties} part at a near tie of the target)",
        f"bit-identical states  {c.bit_identical_states}/{c.identical_ids}",
        f"beyond tolerance      {len(c.beyond_tolerance)} (relative error > {c.tolerance})",
    ]
    for name, worst in c.max_relative_error.items():
        lines.append(
            f"  {name:<14} max relative error {worst:.5f}, mean {c.mean_relative_error[name]:.5f}"
        )
    lines += [f"ids differ: {why}" for why in c.ids_differ[:20]]
    lines += [f"beyond tolerance: {why}" for why in c.beyond_tolerance[:20]]
    lines.append("AGREE" if c.ok else "DIFFER")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compare the states of two shards.")
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument(
        "--target", type=Path, help="the target model's directory: explain ids that differ"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    comparison = compare_shards(args.first, args.second, args.tolerance, args.target)
    if args.json:
        print(json.dumps({**asdict(comparison), "ok": comparison.ok}, indent=2))
    else:
        print(format_comparison(comparison))
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
