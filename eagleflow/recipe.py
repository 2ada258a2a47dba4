"""The training recipe's choices outside the model: optimizer, learning-rate schedule, and how
the drafter's output head starts (bench/recipes.py measures each against the others)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.optim._muon import _adjust_lr  # Muon's per-matrix learning rate

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
    model: nn.Module,
    target_norm: torch.Tensor,
    target_lm_head: torch.Tensor,
    draft_ids: torch.Tensor,
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


def orthogonalize_float32(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration (torch's, same coefficients and steps) in float32."""
    a, b, c = coefficients
    wide = update.shape[0] <= update.shape[1]
    x = update.float() if wide else update.float().T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


class Float32Muon(torch.optim.Muon):
    """torch's Muon with the Newton-Schulz iteration in float32 instead of bf16. A CPU without
    native bf16 emulates bf16 matmuls: there torch's iteration took a third of every training
    step. The state (momentum buffers) and the update rule are torch's."""

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        for group in self.param_groups:
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"].lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize_float32(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"]
                )
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], p.shape))


def build_optimizer(
    model: nn.Module, *, name: str, lr: float, weight_decay: float, bf16_muon: bool = True
) -> Optimizers:
    """AdamW for every trainable parameter, or Muon for the hidden matrices (fc, attention, MLP)
    with AdamW for the norms, the lm_head and an own embedding, as Muon's authors apply it.
    Muon's step is scaled to AdamW's update size (`match_rms_adamw`), so one learning rate
    serves both. `bf16_muon` False (no native bf16): its iteration runs in float32."""
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
    muon = (torch.optim.Muon if bf16_muon else Float32Muon)(
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
