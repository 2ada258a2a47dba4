"""The training-time-test objective: per chain step, the forward KL of the drafter's logits to the
target's over the slots a served chain drafts from, plus optionally a cross-entropy term on the
target's argmax."""

from __future__ import annotations

from collections.abc import Callable

import torch


def ttt_terms(
    draft_outputs: list[torch.Tensor],
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    teacher_logp: torch.Tensor,
    argmax_in_draft: torch.Tensor,
    loss_mask: torch.Tensor,
    accuracy: bool = True,
    hard_label_weight: float = 0.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per step k: summed loss, number of valid slots and number of argmax matches (zero
    without `accuracy`: the argmaxes only feed logged metrics). A slot's loss is its forward KL
    plus `hard_label_weight` x the cross-entropy of the target's argmax: where the target's two
    best tokens nearly tie, the KL asks for ~50/50 and leaves the drafter's pick to chance, while
    greedy serving accepts only the token the target takes.

    Slot t of step k predicts token t+2+k with the teacher of position t+1+k. It counts when that
    token and the input token t+1+k are both assistant tokens (drafting starts at the last prompt
    position) and the target's argmax lies in the draft vocab. Logits are computed for those
    slots only.
    """
    loss_sums, counts, correct = [], [], []
    teacher_p = teacher_logp.exp()
    teacher_neg_entropy = (teacher_p * teacher_logp).sum(-1)
    teacher_best = teacher_logp.argmax(-1) if accuracy or hard_label_weight else None
    for step, outputs in enumerate(draft_outputs):
        shift, valid = chain_step_slots(loss_mask, argmax_in_draft, step)
        logits, log_norm, loss = slot_kl(
            outputs, to_logits, teacher_p, teacher_neg_entropy, shift, valid
        )
        best = teacher_best[:, shift:][valid] if teacher_best is not None else None
        if hard_label_weight:
            loss = loss + hard_label_weight * argmax_cross_entropy(logits, log_norm, best)
        loss_sums.append(loss.sum())
        counts.append(valid.sum())
        if not accuracy:
            correct.append(torch.zeros((), dtype=torch.int64, device=valid.device))
        else:
            correct.append((logits.argmax(-1) == best).sum())
    return loss_sums, counts, correct


def chain_step_slots(
    loss_mask: torch.Tensor, argmax_in_draft: torch.Tensor, step: int
) -> tuple[int, torch.Tensor]:
    """Chain step `step`'s shift and its [B, T - shift] mask of the slots that count (see
    ttt_terms): slot t lines up with position t + shift, so the teacher is sliced, not copied."""
    shift = min(1 + step, loss_mask.shape[1])  # samples shorter than the chain: nothing counts
    valid = loss_mask[:, shift:] & argmax_in_draft[:, shift:]
    next_is_assistant = torch.zeros_like(valid)
    next_is_assistant[:, :-1] = loss_mask[:, shift + 1 :]
    return shift, valid & next_is_assistant


def slot_kl(
    outputs: torch.Tensor,
    to_logits: Callable[[torch.Tensor], torch.Tensor],
    teacher_p: torch.Tensor,
    teacher_neg_entropy: torch.Tensor,
    shift: int,
    valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's float32 logits at the valid slots of one chain step, their logsumexp
    (reused by terms on top of the KL), and each slot's KL(p || softmax(z)) = sum p log p +
    logsumexp(z) - p.z (the teacher's terms computed once per batch: two passes over the
    logits, where log_softmax, then p * (log p - log q) took five)."""
    rows = outputs[:, : valid.shape[1]][valid]
    logits = to_logits(pad_rows(rows)).float()[: rows.shape[0]]
    log_norm = torch.logsumexp(logits, -1)
    cross = (teacher_p[:, shift:][valid] * logits).sum(-1)
    return logits, log_norm, teacher_neg_entropy[:, shift:][valid] + log_norm - cross


def argmax_cross_entropy(
    logits: torch.Tensor, log_norm: torch.Tensor, best: torch.Tensor
) -> torch.Tensor:
    """Each slot's cross-entropy of the target's argmax `best`, from the logits and their
    logsumexp `log_norm` (slot_kl's): logsumexp(z) - z[best]."""
    return log_norm - logits.gather(-1, best[:, None]).squeeze(-1)


def pad_rows(rows: torch.Tensor, multiple: int = 128) -> torch.Tensor:
    """Zero rows up to a multiple of `multiple`. On CPUs oneDNN compiles a kernel per matmul shape
    and caches 1,024 of them: a new row count at every chain step of every batch evicted the
    whole cache, and steps slowed as the run went on."""
    extra = -rows.shape[0] % multiple
    return torch.nn.functional.pad(rows, (0, 0, 0, extra)) if extra else rows
