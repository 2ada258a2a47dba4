"""EAGLE-3 drafter training from zarr shards: the loop, resume, DDP, export. The objective is in
eagleflow.ttt_loss, what survives a crash in eagleflow.checkpoints.

Run in-process (`train_drafter`) or under torchrun (`python -m eagleflow.train SETTINGS.json`).
With N processes every rank sums its loss over its share of the global batch and divides by the
global count of positions, so N processes follow the 1-process loss curve for the same batches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from eagleflow.checkpoints import (
    MetricsLog,
    checkpoint_paths,
    latest_checkpoint,
    save_checkpoint,
    training_code,
)
from eagleflow.drafter import DrafterConfig, Eagle3Drafter, TargetHead, load_target_head
from eagleflow.export import RECIPE_FLAGS, export_speculators, export_vllm
from eagleflow.files import atomic_output, tree_files
from eagleflow.loader import TrainBatches, list_samples, make_loader, pack_batches, window_tokens
from eagleflow.logs import InputError, setup_job_logging
from eagleflow.manifest import manifest_path
from eagleflow.precision import native_bf16
from eagleflow.progress import token_progress
from eagleflow.recipe import WeightAverage, build_optimizer, init_head_from_target, lr_at
from eagleflow.shards import open_shard
from eagleflow.ttt_loss import ttt_terms
from eagleflow.vocab import draft_to_target_ids, load_vocab_map

log = logging.getLogger("eagleflow.train")


@dataclass
class TrainSettings:
    shards: list[str]
    vocab: str
    target: str
    out_vllm: str
    out_speculators: str
    metrics: str
    checkpoint_dir: str
    steps: int = 1200
    batch_tokens: int = 2048
    learning_rate: float = 5e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ttt_steps: int = 7
    step_weight: float = 0.4
    # Weight of a cross-entropy term on the target's argmax, added to each slot's KL.
    hard_label_weight: float = 0.0
    heldout_fraction: float = 0.05
    seed: int = 0
    checkpoint_every: int = 500
    eval_every: int = 750
    log_every: int = 10
    num_workers: int = 1
    num_speculative_tokens: int = 3
    # Drafter matmuls under bf16 autocast (fp32 weights), "fp32", or "auto": bf16 where native.
    precision: str = "auto"
    # The recipe (see eagleflow/recipe.py and bench/recipes.py): drafter architecture flags by
    # vLLM's names, how the lm_head starts and whether it trains, optimizer, schedule.
    norm_before_fc: bool = True
    fc_norm: bool = False
    norm_before_residual: bool = True
    norm_output: bool = False
    # The drafter MLP's width as a multiple of the target's intermediate_size.
    intermediate_scale: float = 1.0
    lm_head_init: str = "target"
    freeze_lm_head: bool = False
    # False: the drafter trains its own copy of the target's embedding and ships it.
    freeze_embedding: bool = True
    optimizer: str = "muon"
    lr_schedule: str = "cosine"
    # Export an exponential moving average of the weights (0: the last step's weights).
    ema_decay: float = 0.0
    threads: int = 0  # torch threads per process; 0 = leave torch's choice

    def fingerprint(self) -> str:
        """What decides the trajectory: a checkpoint of other settings, data or training code
        (this package's modules that training imports, and torch) is not resumed."""
        keys = asdict(self)
        for name in (
            "out_vllm",
            "out_speculators",
            "metrics",
            "checkpoint_dir",
            "num_workers",
            "eval_every",
            "checkpoint_every",
            "threads",
        ):
            keys.pop(name)
        keys["shards"] = [_shard_identity(path) for path in self.shards]
        keys["vocab"] = hashlib.sha256(Path(self.vocab).read_bytes()).hexdigest()
        keys["target"] = hashlib.sha256(
            (Path(self.target) / "config.json").read_bytes()
        ).hexdigest()
        keys["code"] = training_code()
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


def _shard_identity(path: str) -> str:
    """A shard's name and content: its manifest (the sha256 of every file of the store), so
    that states extracted anew (another engine dtype, a repair that came back different) under
    the same metadata start training over rather than resume the old states' checkpoints.
    Without a manifest (a store made outside the workflow): its files' sizes and times."""
    store = Path(path)
    manifest = manifest_path(store)
    if manifest.is_file():
        content = manifest.read_bytes()
    else:
        files = tree_files(store)
        content = (store / "zarr.json").read_bytes() + json.dumps(
            [(str(p.relative_to(store)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        ).encode()
    return store.name + ":" + hashlib.sha256(content).hexdigest()


def _padding_batch(cfg: DrafterConfig, length: int, device: torch.device) -> dict:
    """One sample of `length` padding positions: no loss-masked token, so its terms are zero."""
    return {
        "input_ids": torch.zeros(1, length, dtype=torch.long, device=device),
        "loss_mask": torch.zeros(1, length, dtype=torch.bool, device=device),
        "aux": torch.zeros(1, length, cfg.num_aux * cfg.target_hidden_size, device=device),
        "last": torch.zeros(1, length, cfg.target_hidden_size, device=device),
    }


def _all_sum(values: list[torch.Tensor]) -> torch.Tensor:
    """Sums over ranks, as a float64 tensor on the CPU."""
    stacked = torch.stack([v.detach().double().cpu() for v in values])
    if dist.is_initialized():
        on_device = stacked.to(training_device())  # nccl reduces CUDA tensors only
        dist.all_reduce(on_device)
        stacked = on_device.cpu()
    return stacked


def training_device() -> torch.device:
    """This process's GPU when there is one (torchrun's LOCAL_RANK picks it), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _on(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def learning_rate(step: int, s: TrainSettings) -> float:
    return lr_at(
        step, peak=s.learning_rate, warmup=s.warmup_steps, total=s.steps,
        min_ratio=s.min_lr_ratio, schedule=s.lr_schedule,
    )  # fmt: skip


def _batch_terms(
    model,
    head: TargetHead,
    batch: dict,
    s: TrainSettings,
    draft_ids: torch.Tensor,
    accuracy: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    # The teacher runs outside autocast, its logits rounded to the lm_head's bf16 as a target
    # served in bf16 computes them. Exact float32 logits served no more, even where the target
    # is served in float32 (bench/screens.py float32_teacher).
    teacher_logp, argmax_in_draft = head.teacher(batch["last"], draft_ids)
    module = model.module if hasattr(model, "module") else model
    device = batch["aux"].device.type
    # bf16 matmuls (tensor cores on GPUs; AVX512-BF16 or AMX on CPUs): the demo's train job took
    # 381 s against 427 s in float32 on an AMD EPYC, a screen 556 s against 590 s on a Xeon with
    # AMX (bench/RESULTS.md "Training in float32", screens.precision).
    bf16 = s.precision == "bf16" or (s.precision == "auto" and native_bf16(batch["aux"].device))
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        outputs = model(batch["aux"].float(), batch["input_ids"], head.embed, s.ttt_steps)
        return ttt_terms(
            outputs, module.logits, teacher_logp, argmax_in_draft, batch["loss_mask"], accuracy,
            hard_label_weight=s.hard_label_weight,
        )  # fmt: skip


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, head: TargetHead, s: TrainSettings, draft_ids: torch.Tensor
) -> dict[str, float]:
    """Held-out loss_k and acc_k (draft argmax == target argmax) over the held-out split."""
    refs = list_samples(s.shards, s.heldout_fraction, "heldout")
    if not refs:
        return {}
    rank, world = _rank_world()
    batches = [b[rank::world] for b in pack_batches(refs, range(len(refs)), s.batch_tokens)]
    totals = torch.zeros(3, s.ttt_steps, dtype=torch.float64)
    module = model.module if hasattr(model, "module") else model
    module.eval()
    for batch in make_loader(s.shards, refs, batches, num_workers=0):
        if "empty" in batch:
            continue
        batch = _on(batch, draft_ids.device)
        kl, count, correct = _batch_terms(module, head, batch, s, draft_ids)
        terms = (kl, count, correct)
        totals += torch.stack([torch.stack([x.double().cpu() for x in t]) for t in terms])
    module.train()
    kl, count, correct = _all_sum(list(totals))
    metrics = {"positions": float(count[0])}
    for k in range(s.ttt_steps):
        metrics[f"loss_{k}"] = float(kl[k] / count[k].clamp(min=1))
        metrics[f"acc_{k}"] = float(correct[k] / count[k].clamp(min=1))
    return metrics


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_drafter(s: TrainSettings) -> dict[str, float]:
    """Train (or resume) and export; returns the final held-out metrics."""
    # Once the drafter is confident, softmax gradients hold many denormal floats, which x86
    # computes ~100x slower: steps took twice as long late in a run. Flush them to zero, before
    # torch starts its thread pool so that every thread inherits the setting.
    torch.set_flush_denormal(True)
    # oneDNN (CPU matmuls) compiles a kernel per shape and keeps 1,024; batches of varying length
    # need a few thousand. Evicting them cost 11% of a 600-step run's tokens/s, 21% in its last
    # quarter (bench/kernel_cache.py). Read when the first kernel is built: a process that
    # already ran one keeps its setting.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8192")
    if s.threads:
        torch.set_num_threads(s.threads)
    rank, world = _rank_world()
    torch.manual_seed(s.seed)
    first = open_shard(s.shards[0])
    aux_ids = list(first.attrs["aux_layer_ids"])
    for path in s.shards[1:]:
        if list(open_shard(path).attrs["aux_layer_ids"]) != aux_ids:
            raise InputError(f"{path}: aux layer ids differ from {s.shards[0]}'s {aux_ids}")
    d2t, t2d = load_vocab_map(s.vocab)
    device = training_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    draft_ids = draft_to_target_ids(d2t).to(device)
    flags = {name: getattr(s, name) for name in RECIPE_FLAGS}
    cfg = DrafterConfig.from_target(
        s.target, len(d2t), len(aux_ids), intermediate_scale=s.intermediate_scale,
        own_embedding=not s.freeze_embedding, **flags,
    )  # fmt: skip
    head = load_target_head(s.target).to(device)
    model = Eagle3Drafter(cfg, d2t, t2d).to(device)
    if cfg.own_embedding:
        model.embed_tokens.weight.data.copy_(head.embed.weight)
    if s.lm_head_init == "target":
        init_head_from_target(model, head.norm.weight, head.lm_head, draft_ids)
    model.lm_head.weight.requires_grad_(not s.freeze_lm_head)
    optimizer = build_optimizer(
        model, name=s.optimizer, lr=s.learning_rate, weight_decay=s.weight_decay,
        bf16_muon=native_bf16(device),
    )  # fmt: skip
    average = WeightAverage(model, s.ema_decay) if s.ema_decay else None
    checkpoint_dir = Path(s.checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = s.fingerprint()
    state = latest_checkpoint(checkpoint_dir, fingerprint)
    start = 0
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if average is not None:
            average.load_state_dict(state["average"])
        start = state["step"]
        log.info("resuming from checkpoint %s at step %d of %d", state["path"], start, s.steps)
    else:
        if rank == 0:
            for stale in checkpoint_paths(checkpoint_dir):
                stale.unlink(missing_ok=True)
        if world > 1:
            dist.barrier()  # the other ranks save none before rank 0 has cleared them
        log.info("starting from step 0 of %d (no checkpoint of this run)", s.steps)
    if world > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    refs = list_samples(s.shards, s.heldout_fraction, "train")
    if not refs:
        raise InputError("no training samples: every sample fell into the held-out split")
    batches = TrainBatches(
        refs,
        batch_tokens=s.batch_tokens,
        seed=s.seed,
        start_step=start,
        num_steps=s.steps,
        rank=rank,
        world=world,
        window=window_tokens(s.shards),
    )
    loader = make_loader(s.shards, refs, batches, num_workers=s.num_workers)
    # Logged next to the checkpoints (which survive a crash, unlike an unfinished output) and
    # copied to the output at the end, so a resumed run's metrics start at step 1.
    live_metrics = checkpoint_dir / "metrics.tsv"
    metrics_log = MetricsLog(live_metrics, s.ttt_steps, start) if rank == 0 else None
    weights = [s.step_weight**k for k in range(s.ttt_steps)]
    bar = token_progress(s.steps, "train drafter", "step", initial=start, disable=rank != 0)
    step, rate_tokens, rate_start = start, 0, time.perf_counter()
    with bar as progress:
        for batch in loader:
            batch = _on(batch, device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, s)
            if "empty" in batch:  # no sample for this rank in a small global batch
                # DDP all-reduces the gradients of a backward that follows a forward through the
                # wrapped model, on every rank: a padding-only sample gives zero terms (a backward
                # without that forward left the other ranks waiting forever).
                batch = _padding_batch(cfg, s.ttt_steps + 2, device)
            # Argmaxes only where a metrics row is written: the row reports them.
            logged = (step + 1) % s.log_every == 0 or step + 1 == s.steps
            kl, count, correct = _batch_terms(model, head, batch, s, draft_ids, accuracy=logged)
            tokens = int(batch["input_ids"].ne(0).sum())
            totals = _all_sum([*count, *correct, torch.tensor(tokens)])
            global_count = totals[: s.ttt_steps].clamp(min=1)
            # DDP averages gradients over ranks: scale by world so the sum over ranks is exact.
            terms = zip(weights, kl, global_count.float(), strict=True)
            loss = sum(w * kl_k / count_k for w, kl_k, count_k in terms) * world
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            optimizer.step()
            if average is not None:
                average.update()
            step += 1
            rate_tokens += int(totals[-1])
            global_loss = _all_sum([loss.detach() / world])[0]
            progress.advance(1, int(totals[-1]))
            if metrics_log and logged:
                elapsed = time.perf_counter() - rate_start
                acc = totals[s.ttt_steps : 2 * s.ttt_steps] / global_count
                row = {
                    "step": step,
                    "split": "train",
                    "lr": learning_rate(step - 1, s),
                    "loss": float(global_loss),
                    "tokens_per_s": rate_tokens / elapsed,
                }
                row.update({f"acc_{k}": float(acc[k]) for k in range(s.ttt_steps)})
                metrics_log.write(row)
                progress.advance(
                    0, 0, loss=f"{float(global_loss):.3f}", acc0=f"{float(acc[0]):.3f}"
                )
                rate_tokens, rate_start = 0, time.perf_counter()
            if step % s.checkpoint_every == 0 and step < s.steps and rank == 0:
                save_checkpoint(checkpoint_dir, step, model, optimizer, fingerprint, average)
            if s.eval_every and step % s.eval_every == 0 and step < s.steps:
                _log_eval(model, head, s, draft_ids, step, metrics_log)
            if step % s.checkpoint_every == 0 or (s.eval_every and step % s.eval_every == 0):
                rate_tokens, rate_start = 0, time.perf_counter()  # tokens/s of training only
    if average is not None:  # the averaged weights are evaluated and exported
        average.copy_to_model()
    final = _log_eval(model, head, s, draft_ids, step, metrics_log)
    if rank == 0:
        with atomic_output(s.metrics) as tmp:
            shutil.copyfile(live_metrics, tmp)
        module = model.module if hasattr(model, "module") else model
        export_vllm(module, aux_ids, s.out_vllm)
        export_speculators(
            module,
            aux_ids,
            s.out_speculators,
            target=s.target,
            num_speculative_tokens=s.num_speculative_tokens,
        )
        save_checkpoint(checkpoint_dir, step, model, optimizer, fingerprint, average)
    return final


def _log_eval(model, head, s, draft_ids, step, metrics_log) -> dict[str, float]:
    metrics = evaluate(model, head, s, draft_ids)
    if metrics_log and metrics:
        loss = sum(s.step_weight**k * metrics[f"loss_{k}"] for k in range(s.ttt_steps))
        metrics_log.write({"step": step, "split": "heldout", "loss": loss, **metrics})
        log.info(
            "step %d held-out (%d positions): %s",
            step,
            metrics["positions"],
            " ".join(f"acc_{k}={metrics[f'acc_{k}']:.3f}" for k in range(s.ttt_steps)),
        )
    return metrics


@contextlib.contextmanager
def _distributed() -> Iterator[None]:
    """Join the torchrun process group when launched by torchrun (gloo on CPU, nccl on GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        try:
            yield
        finally:
            dist.destroy_process_group()
    else:
        yield


def run_training(s: TrainSettings, *, nproc: int = 1, log_path: str | None = None) -> None:
    """Train in this process, or in `nproc` processes under torchrun."""
    if nproc == 1:
        train_drafter(s)
        return
    threads = max(1, (s.threads or os.cpu_count() or 1) // nproc)
    with tempfile.TemporaryDirectory() as tmp:
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(json.dumps(asdict(s) | {"threads": threads}))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "eagleflow.train",
            str(settings_file),
        ]
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "EAGLEFLOW_TRAIN_LOG": log_path or ""}
        subprocess.run(command, check=True, env=env)


def main(argv: list[str] | None = None) -> None:
    """`python -m eagleflow.train SETTINGS.json` (also under torchrun)."""
    args = argv if argv is not None else sys.argv[1:]
    settings = TrainSettings(**json.loads(Path(args[0]).read_text()))
    rank_zero = int(os.environ.get("RANK", "0")) == 0  # one log file line per event
    setup_job_logging(os.environ.get("EAGLEFLOW_TRAIN_LOG") if rank_zero else None, fresh=False)
    with _distributed():
        train_drafter(settings)


if __name__ == "__main__":
    main()
