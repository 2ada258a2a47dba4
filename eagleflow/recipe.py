"""The training recipe's choices outside the model: optimizer, learning-rate schedule, and how
the drafter's output head starts (bench/recipes.py measures each against the others)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "linear", "constant")
LM_HEAD_INITS = ("random", "target")


def lr_at(
    step: int, *, peak: float, warmup: int, total: int, min_ratio: float, schedule: str = "cosine"
) -> float:
    """Linear warmup, then a cosine or linear decay to min_ratio of the peak (or none)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return peak * (min_ratio + (1 - min_ratio) * shape)


def init_head_from_target(
    model: nn.Module, target_norm: torch.Tensor, target_lm_head: torch.Tensor, draft_ids
) -> None:
    """Start the drafter's final norm and lm_head as the target's, restricted to the draft
    vocab: step 0's logits are then the target's own for a drafter that reproduces the target's
    last hidden state."""
    with torch.no_grad():
        model.norm.weight.copy_(target_norm.float())
        model.lm_head.weight.copy_(target_lm_head[draft_ids.to(target_lm_head.device)].float())


class Optimizers:
    """Several torch optimizers stepped as one (Muon takes only matrices; the rest go to AdamW):
    the few methods the training loop and its checkpoints use."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt in self.optimizers]

    def load_state_dict(self, states: list[dict]) -> None:
        for opt, state in zip(self.optimizers, states, strict=True):
            opt.load_state_dict(state)


def build_optimizer(model: nn.Module, *, name: str, lr: float, weight_decay: float) -> Optimizers:
    """AdamW for every trainable parameter, or Muon for the hidden matrices (fc, attention, MLP)
    with AdamW for the norms, the lm_head and an own embedding, as Muon's authors apply it.
    Muon's step is scaled to AdamW's update size (`match_rms_adamw`), so one learning rate
    serves both."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    adamw = dict(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    if name == "adamw":
        return Optimizers([torch.optim.AdamW([p for _, p in trainable], **adamw)])
    if name != "muon":
        raise ValueError(f"optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    matrices, others = [], []
    for n, p in trainable:
        hidden = p.ndim == 2 and not n.startswith(("lm_head", "embed_tokens"))
        (matrices if hidden else others).append(p)
    muon = torch.optim.Muon(
        matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"
    )
    return Optimizers([muon, *([torch.optim.AdamW(others, **adamw)] if others else [])])


class WeightAverage:
    """An exponential moving average of the trainable weights, for the exported drafter: it
    averages about the last 1 / (1 - decay) steps instead of taking the last one's weights."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.average = [p.detach().clone() for p in self.params]
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        # Early steps weigh more than `decay` allows: the random start is forgotten quickly.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1 - decay)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        torch._foreach_copy_(self.params, self.average)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch._foreach_copy_(self.average, state["average"])
        self.updates = state["updates"]
