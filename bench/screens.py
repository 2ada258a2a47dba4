"""Recipe screens: the configured recipe of a finished demo run trained with one change that the
trainer has no setting for (the change is patched in for this process only), then served in vLLM
at K=3 and 5, T=0 and 1.0, with bench/peer.py's arguments, so that each can be paired with the
default's peer rows at the same seed.

Not adopted changes stay out of the package: each variant below patches one function of it.
`--set FIELD=VALUE` changes a TrainSettings field instead (ema_decay, warmup_steps, ...).

    .venv/bin/python bench/screens.py --run RUN --variant kv_heads --value 2 --seed 0 --out DIR
    .venv/bin/python bench/screens.py --run RUN --set ema_decay=0.995 --seed 3 --out DIR --threads 1

Prints and writes DIR/result.json: held-out acc_0..2, the training seconds, and the served mean
acceptance length by K and temperature. Rows: bench/figures/screens.*.json, written from those.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from recipes import settings_for

import eagleflow.drafter as drafter_module
import eagleflow.recipe as recipe_module
import eagleflow.train as train_module
from eagleflow.serving_check import serving_acceptance
from eagleflow.target_config import target_text_config
from eagleflow.train import TrainSettings
from eagleflow.ttt_loss import argmax_cross_entropy, chain_step_slots, slot_kl


def head_lr(scale: float, s: TrainSettings) -> None:
    """The AdamW group (lm_head, norms) steps at `scale` x the scheduled rate; Muon's matrices
    keep theirs."""
    plain_step = recipe_module.Optimizers.step

    def scaled_step(self) -> None:
        groups = [g for opt in self.optimizers[1:] for g in opt.param_groups]
        for group in groups:
            group["lr"] *= scale
        plain_step(self)
        for group in groups:
            group["lr"] /= scale

    recipe_module.Optimizers.step = scaled_step


def edit_new_drafters(edit: Callable[[torch.nn.Module], None]) -> None:
    """Apply `edit` (under no_grad) to every drafter right after it is built."""
    plain_init = drafter_module.Eagle3Drafter.__init__

    def init(self, *args, **kwargs) -> None:
        plain_init(self, *args, **kwargs)
        with torch.no_grad():
            edit(self)

    drafter_module.Eagle3Drafter.__init__ = init


def edit_new_optimizers(edit: Callable[[torch.nn.Module, recipe_module.Optimizers], None]) -> None:
    """Apply `edit` to the optimizers training builds, given the model, before the first step."""
    plain = train_module.build_optimizer

    def build_optimizer(model, **kwargs):
        optimizers = plain(model, **kwargs)
        edit(model, optimizers)
        return optimizers

    train_module.build_optimizer = build_optimizer


def zero_out_init(_: float, s: TrainSettings) -> None:
    """The layer's o_proj and down_proj start at zero (modded-nanogpt's start for Muon blocks)."""

    def zero_out(drafter) -> None:
        drafter.midlayer.self_attn.o_proj.weight.zero_()
        drafter.midlayer.mlp.down_proj.weight.zero_()

    edit_new_drafters(zero_out)


def init_std(std: float, s: TrainSettings) -> None:
    """The fc and the layer's matrices start normal(0, std) (HF's Llama init, initializer_range
    0.02) instead of torch's Linear default (uniform, std 1/sqrt(3 fan_in): 0.03-0.05 here)."""

    def redraw(drafter) -> None:
        for module in (drafter.fc, *drafter.midlayer.modules()):
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std)

    edit_new_drafters(redraw)


def fc_identity(scale: float, s: TrainSettings) -> None:
    """The fc starts passing the last aux state through: `scale` x identity added on its block
    of the fc's columns (the rest keeps torch's default), so step 0's hidden input starts as
    the target's deepest captured state instead of a random projection of all three."""

    def add_identity(drafter) -> None:
        hidden = drafter.cfg.hidden_size
        drafter.fc.weight[:, -hidden:] += scale * torch.eye(hidden)

    edit_new_drafters(add_identity)


def wsd(decay_from: float, s: TrainSettings) -> None:
    """Warmup, the peak until `decay_from` of the steps, then linear to 0 (instead of cosine)."""

    def learning_rate(step: int, t: TrainSettings) -> float:
        if step < t.warmup_steps:
            return t.learning_rate * (step + 1) / t.warmup_steps
        start = int(decay_from * t.steps)
        if step < start:
            return t.learning_rate
        return t.learning_rate * max(0.0, 1 - (step - start) / max(1, t.steps - start))

    train_module.learning_rate = learning_rate


def kv_heads(count: float, s: TrainSettings) -> None:
    """The drafter layer's attention with `count` key/value heads instead of the target's."""
    plain = drafter_module.DrafterConfig.from_target.__func__

    def from_target(cls, *args, **kwargs):
        return dataclasses.replace(plain(cls, *args, **kwargs), num_key_value_heads=int(count))

    train_module.DrafterConfig.from_target = classmethod(from_target)


def ttt_terms_with(slot_loss: Callable) -> Callable:
    """eagleflow.ttt_loss.ttt_terms with each chain step's loss the sum of
    slot_loss(kl, logits, log_norm, teacher, step) over its valid slots (their KL, the drafter's
    logits and their logsumexp, the teacher's log-probs there; the chain step), which returns
    the per-slot loss and the teacher's token that the logged accuracy counts."""

    def ttt_terms(
        draft_outputs, to_logits, teacher_logp, argmax_in_draft, loss_mask, accuracy=True,
        hard_label_weight=0.0,
    ):  # fmt: skip
        if hard_label_weight:
            raise ValueError("a slot-loss screen replaces the loss: set hard_label_weight=0")
        loss_sums, counts, correct = [], [], []
        teacher_p = teacher_logp.exp()
        teacher_neg_entropy = (teacher_p * teacher_logp).sum(-1)
        for step, outputs in enumerate(draft_outputs):
            shift, valid = chain_step_slots(loss_mask, argmax_in_draft, step)
            logits, log_norm, kl = slot_kl(
                outputs, to_logits, teacher_p, teacher_neg_entropy, shift, valid
            )
            loss, best = slot_loss(kl, logits, log_norm, teacher_logp[:, shift:][valid], step)
            loss_sums.append(loss.sum())
            counts.append(valid.sum())
            correct.append((logits.argmax(-1) == best).sum())
        return loss_sums, counts, correct

    return ttt_terms


def weighted_ttt_terms(weight_of: Callable) -> Callable:
    """Each slot's KL multiplied by weight_of(q_best, p_best) (the drafter's and the teacher's
    probability of the teacher's argmax; detached), divided by its mean over the chain step's
    slots."""

    def slot_loss(kl, logits, log_norm, teacher, step):
        best = teacher.argmax(-1)
        q_best = -argmax_cross_entropy(logits, log_norm, best)
        weight = weight_of(q_best.exp().detach(), teacher.amax(-1).exp())
        return kl * weight / weight.mean().clamp(min=1e-6), best

    return ttt_terms_with(slot_loss)


def focal(gamma: float, s: TrainSettings) -> None:
    """Each slot's KL weighted by (1 - q(target's argmax))^gamma: toward the slots the drafter
    still gets wrong."""
    train_module.ttt_terms = weighted_ttt_terms(
        lambda q_best, p_best: (1 - q_best).clamp(min=0) ** gamma
    )


def confidence(gamma: float, s: TrainSettings) -> None:
    """Each slot's KL weighted by p(target's argmax)^gamma under the teacher: away from the
    slots where the target itself nearly ties, which a greedy drafter matches by chance."""
    train_module.ttt_terms = weighted_ttt_terms(lambda q_best, p_best: p_best**gamma)


def top_ratio(weight: float, s: TrainSettings) -> None:
    """The KL plus `weight` x the squared error of the drafter's log-ratios of the teacher's
    top 4 tokens to its top 1, each weighted by the teacher's probability of that token: the
    near ties (where most position-1 misses are, bench/near_ties.py) get the order of their
    two tokens pushed harder than the KL pushes it (q_i - p_i, small when q is near p)."""

    def slot_loss(kl, logits, log_norm, teacher, step):
        top_logp, ids = teacher.topk(4, -1)
        drafted = logits.gather(-1, ids)
        error = (drafted[:, 1:] - drafted[:, :1]) - (top_logp[:, 1:] - top_logp[:, :1])
        return kl + weight * (top_logp[:, 1:].exp() * error.square()).sum(-1), ids[:, 0]

    train_module.ttt_terms = ttt_terms_with(slot_loss)


def first_step_hard_label(weight: float, s: TrainSettings) -> None:
    """`hard_label_weight` at chain step 0 only: the near ties it is for are position 1's
    misses, and the later steps keep the plain KL (the setting on every step serves less at
    T=1.0 K=3)."""

    def slot_loss(kl, logits, log_norm, teacher, step):
        best = teacher.argmax(-1)
        if step:
            return kl, best
        return kl + weight * argmax_cross_entropy(logits, log_norm, best), best

    train_module.ttt_terms = ttt_terms_with(slot_loss)


def reverse_kl(weight: float, s: TrainSettings) -> None:
    """The KL plus `weight` x the reverse KL(q || p): mode-seeking where the forward KL covers
    mass, it charges the drafter for probability where the teacher has little, pulling its top
    token to the teacher's mode at the near ties (the hard label does that by the argmax alone)."""

    def slot_loss(kl, logits, log_norm, teacher, step):
        log_q = logits - log_norm[:, None]
        return kl + weight * (log_q.exp() * (log_q - teacher)).sum(-1), teacher.argmax(-1)

    train_module.ttt_terms = ttt_terms_with(slot_loss)


def layer_n_aux(_: float, s: TrainSettings) -> None:
    """The target's layer-N state (stored for the teacher) as one more aux input: the shards'
    aux ids plus N, so the export asks vLLM for it (vLLM 0.32 captures a state after each
    layer idx + 1, N included)."""
    plain_open, plain_terms = train_module.open_shard, train_module._batch_terms
    layer_n = int(target_text_config(s.target)["num_hidden_layers"])

    class WithLayerN:
        def __init__(self, group) -> None:
            self.group = group
            self.attrs = {**group.attrs, "aux_layer_ids": [*group.attrs["aux_layer_ids"], layer_n]}

        def __getattr__(self, name: str):
            return getattr(self.group, name)

    def batch_terms(model, head, batch, *args, **kwargs):
        aux = torch.cat([batch["aux"].float(), batch["last"].float()], dim=-1)
        return plain_terms(model, head, {**batch, "aux": aux}, *args, **kwargs)

    train_module.open_shard = lambda path: WithLayerN(plain_open(path))
    train_module._batch_terms = batch_terms


def float32_teacher(_: float, s: TrainSettings) -> None:
    """The teacher's logits in float32: the target head's lm_head kept in float32 instead of
    bf16, so TargetHead.teacher neither rounds the final norm's output nor the logits, as a
    target served in float32 computes them (on the AVX2-only demo the bf16 rounding moved the
    argmax off the data's token at 0.6% of answer positions, float32 at 0.04%)."""
    plain_load = train_module.load_target_head

    def load_target_head(model_dir):
        head = plain_load(model_dir)
        head.lm_head = head.lm_head.float()
        return head

    train_module.load_target_head = load_target_head


def muon_head(_: float, s: TrainSettings) -> None:
    """The lm_head stepped by Muon with the hidden matrices instead of by AdamW (Muon's authors
    keep it in AdamW; Muon's orthogonalized steps may learn the output rows faster)."""

    def move_head(model, optimizers) -> None:
        muon, adamw = optimizers.optimizers
        head = model.lm_head.weight
        adamw.param_groups[0]["params"] = [
            p for p in adamw.param_groups[0]["params"] if p is not head
        ]
        muon.param_groups[0]["params"].append(head)

    edit_new_optimizers(move_head)


def muon_momentum(momentum: float, s: TrainSettings) -> None:
    """Muon's momentum (torch's default 0.95): with 2,048-token batches the gradient is noisy,
    and the momentum sets how many steps' gradients each orthogonalized step averages."""

    def set_momentum(_, optimizers) -> None:
        for group in optimizers.optimizers[0].param_groups:
            group["momentum"] = momentum

    edit_new_optimizers(set_momentum)


def data_seed(seed: float, s: TrainSettings) -> None:
    """The data order of train seed `seed`, the initialization of --seed: whether a seed's
    result follows its initialization or its data order."""
    plain = train_module.TrainBatches

    def batches(*args, **kwargs):
        return plain(*args, **{**kwargs, "seed": int(seed)})

    train_module.TrainBatches = batches


def detach_feedback(_: float, s: TrainSettings) -> None:
    """The state fed back from chain step k-1 is detached, so step k's loss no longer trains
    what the earlier steps computed it from (ours and the peer's trainer backpropagate through
    the chain)."""
    plain = drafter_module.MidLayer.forward

    def forward(self, embeds, hidden, positions, cache):
        if cache:  # a later chain step
            hidden = hidden.detach()
        return plain(self, embeds, hidden, positions, cache)

    drafter_module.MidLayer.forward = forward


VARIANTS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        head_lr,
        zero_out_init,
        init_std,
        wsd,
        kv_heads,
        focal,
        layer_n_aux,
        float32_teacher,
        confidence,
        data_seed,
        muon_head,
        muon_momentum,
        top_ratio,
        detach_feedback,
        fc_identity,
        first_step_hard_label,
        reverse_kl,
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished demo run (its root)")
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="the patched change")
    parser.add_argument("--value", type=float, default=0.0, help="the variant's parameter")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a TrainSettings field (YAML value), e.g. ema_decay=0.995",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="0: every core")
    parser.add_argument("--steps", type=int, default=None, help="default: the run's")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    s = settings_for(args.run, None, None, args.out, args.seed, args.threads)
    fields = dict(item.split("=", 1) for item in args.set)
    s = dataclasses.replace(s, **{k: yaml.safe_load(v) for k, v in fields.items()})
    if args.steps:
        s = dataclasses.replace(s, steps=args.steps)
    if args.variant:
        VARIANTS[args.variant](args.value, s)
    start = time.perf_counter()
    heldout = train_module.train_drafter(s)
    seconds = time.perf_counter() - start
    served = {}
    for k in (3, 5):
        report = serving_acceptance(
            s.out_vllm, s.shards, s.target, heldout_fraction=s.heldout_fraction, k=k,
            max_tokens=256, max_model_len=1024, max_prompts=100, temperatures=[0.0, 1.0],
            compare_plain=False,
        )  # fmt: skip
        served[k] = {t: v["mean_acceptance_length"] for t, v in report["by_temperature"].items()}
    result = {
        "variant": args.variant, "value": args.value, "set": fields, "seed": args.seed,
        "train_seconds": round(seconds, 1),
        "acc": [round(heldout[f"acc_{i}"], 4) for i in range(3)], "served": served,
    }  # fmt: skip
    print("RESULT", json.dumps(result), flush=True)
    (args.out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
