"""Our drafter against the peer recipe, vLLM's `speculators` 0.9.0 trained by its own trainer on
the same data at the same number of training tokens, both served through one harness.

Not part of CI: the peer package is installed outside the project's environment, and the full
run trains a second drafter (about as long as ours) and builds four vLLM engines.

What it does:

  1. Counts the tokens our trainer consumed: the samples of the `train.steps` batches that
     `eagleflow.loader.TrainBatches` yields for config.yaml's seed and `train.batch_tokens`
     (each sample's stored length, summed; padding not counted).
  2. Converts our shards to speculators' offline-training layout in `--work` (outside the
     repo): `hidden_states/hs_<i>.safetensors` ({"hidden_states": [T, aux layers + last, H]
     bf16, "token_ids": [T] int64}, what its `FileTransfer` reads), the token rows (input_ids,
     loss_mask, seq_len) and `d2t-<N>.npy` / `t2d-<N>.npy` (our draft vocab map; both use the
     same convention: d2t[i] = target_id - i, t2d a bool mask over target rows). Rows 0..n-1
     are exactly our training split (heldout_fraction as config.yaml), rows n.. our held-out
     split, and `--train-data-ratio` is set so that speculators' own split boundary falls at n:
     it trains on our training samples and validates on our held-out ones.
  3. Trains the peer with `speculators.train.cli.main` in a child process: the recipe is the
     package's defaults for `--speculator-type eagle3` (see RECIPE below); the only flags set
     are data, layers, vocab, budget, and the two CPU alternatives the package itself offers.
     Its batch sampler (MultipackDistributedBatchSamplerV2, `--total-seq-len` = our
     `train.batch_tokens`) is replayed before training to pick `--epochs` / `--max-steps` so that
     it consumes the same token count as ours (the first step that reaches it).
  4. Serves ours (`--ours`, results/drafter/vllm) and the peer's last checkpoint
     (speculators-format config.json + model.safetensors, which vLLM reads as method eagle3)
     with `eagleflow.serving_check.serving_acceptance` on the same held-out prompts at each K, and
     prints the served mean acceptance lengths and ours / peer (goal >= 1.05 at K=3 and K=5,
     greedy). It also serves them at each `--sampled` temperature (default 1.0, seeded per
     prompt): reasoning targets are served sampled, so the comparison is reported there too,
     with vLLM drafting as `--draft-sample-method` says (its default: greedy). Greedy, it also
     prints both drafters' acceptance by draft position: where along the chain the margin is.

`--mean-of ROWS...` does none of that: it averages the served figures of stored runs of this
bench (one per train seed, each with `--config` of that seed) and stores ours / peer of the
means, because one training's spread across seeds is as large as the margin.

Install (outside the project's venv; nothing in .venv is upgraded or added):

    .venv/bin/pip install --no-deps --target /tmp/peer speculators==0.9.0 hs-connectors==0.9.0

hs-connectors (pure Python, requires only torch and safetensors) is the package its trainer
reads hidden states through. Its other requirements are either already in .venv (torch 2.13,
transformers 5.19, pydantic, pydantic-settings, loguru, typer, rich, tqdm, openai, safetensors,
numpy) or are not needed on the EAGLE-3 offline path: `datasets` (Arrow storage of the token
rows; it would bring pyarrow, xxhash and multiprocess, compiled wheels), torchvision and
torchaudio (never imported), and Triton (only the fused losses).

Patches needed to run its trainer on this CPU-only machine, all applied in the child process
by `patch_speculators_for_cpu` (the package's files are not edited):

  - `datasets` is replaced in sys.modules by a stand-in (`datasets_stand_in`) whose
    `load_from_disk` reads the token rows this script wrote: `len`, `select`,
    `with_format(None)["seq_len"]` and row access returning torch tensors, the subset that
    speculators.train.data.ArrowDataset uses. train/data.py, train/vocab_mapping.py and
    data_generation/preprocessing.py import `datasets` at module level, so without it
    `import speculators.train.cli` fails: "ModuleNotFoundError: No module named 'datasets'".
  - `speculators.train.trainer.get_local_rank` returns "cpu": the Trainer moves the model and
    every batch to `.to(local_rank)` = `.to(0)`, which on CPU-only torch raises "RuntimeError:
    Cannot access accelerator device when none is available."
  - `Trainer.device_type` is set to "cpu" where the CPU multiplies bf16 natively (AMX or
    AVX512-BF16; `eagleflow.precision.native_bf16`): with no accelerator the Trainer falls
    back to "cuda", and `torch.autocast("cuda", dtype=bfloat16)` disables itself
    ("UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast."), so
    every step would compute in fp32 from the bf16 hidden states. With "cpu" its autocast runs
    as it does on a GPU (bf16 matmuls, fp32 master weights), as our trainer computes in bf16
    there (train.precision auto). On a CPU without native bf16 both compute in fp32: our
    trainer's auto picks it, and the peer keeps its own fallback (emulated bf16 took 4.6 s a
    step on an AVX2-only AMD EPYC, ~90 minutes a training).
  - `torch.accelerator.synchronize` becomes a no-op: the Trainer's step timer calls it on
    logged steps and it raises the same "Cannot access accelerator device" error (CPU ops are
    synchronous, so nothing is lost).

CPU alternatives chosen by flag (options of the package, not patches): `--draft-attn-impl
sdpa` (its default `simple_flex_attention` needs torch.compile'd flex-attention kernels;
sdpa with its dense document/causal/TTT mask is the same attention) and `--loss-implementation
eager` (the fused losses are Triton kernels; eager is its reference implementation of the same
KL). `--num-workers 0` (no spawned loader processes on 2 cores) and `--on-missing raise` (all
hidden states are on disk; never call a vLLM endpoint) change no computation.

RECIPE: speculators 0.9.0's eagle3 defaults, as read in its source (train/config/schema.py,
models/eagle3/core.py, model.py, train/optimizers.py, train/trainer.py):
  - one Llama decoder layer (sizes from the target's config, like ours), all layers sliding
    window 2048 (wider than any sample here); its MLP as wide as our drafter's (our
    `train.intermediate_scale`): the bench sets the width its `resolve_draft_intermediate_size`
    returns (the package's `--draft-config` sets the same, with the whole layer spelled out),
    so both drafters have the same shape and differ only in how they are trained;
  - lm_head initialised from the target's lm_head rows of the draft vocab and frozen
    (model.py `_load_verifier_weights`), embeddings frozen; target logits through a frozen copy
    of the target's final norm and those rows;
  - `norm_before_fc` True (RMSNorm over the concatenated aux states), `norm_output` True (the
    post-norm state is fed back between TTT steps and goes to lm_head), `norm_before_residual`
    True, `fc_norm` False;
  - 3 TTT steps, loss weight `ttt_step_loss_decay ** step` = 1.0 (equal weights), forward KL to
    the target's distribution over the draft vocab (`kl_div`), mean over loss-masked positions
    per step, summed over steps; teacher forcing of the true next tokens between steps;
  - Muon (torch.optim.Muon, lr 1e-3, momentum 0.95, weight decay 0.1, 5 Newton-Schulz steps,
    `match_rms_adamw`) on the 2-D weight matrices, AdamW (lr 1e-3, weight decay 0.01) on the
    rest (norms); linear schedule, warmup 1% of the steps, decay to 0 at `--max-steps`;
  - bf16 autocast with fp32 master weights; gradient clipping at 1.0; packed batches of
    `--total-seq-len` tokens (documents masked from each other); seed as ours.

    .venv/bin/python bench/peer.py --results results                      # full run
    .venv/bin/python bench/peer.py --max-tokens-trained 40000 --ks 3 --prompts 8   # smoke
    .venv/bin/python bench/peer.py --reuse-peer /tmp/eagleflow-peer/peer/export  # serve only
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
import yaml
from rows import REPO, Row, finish, goal_row, load, output_arguments

GOAL_RATIO = 1.05  # ours / peer, served mean acceptance length, at K=3 and K=5
GOAL_KS = (3, 5)
PEER_VERSION = "0.9.0"
ROWS_FILE = "rows.safetensors"  # the token rows the `datasets` stand-in reads
SCHEDULE_FILE = "peer_run.json"


# ---------------------------------------------------------------------------------------------
# Our side: the shards, the split, the tokens our trainer consumed.


def shard_paths(results: Path) -> list[str]:
    """The shards in the plan's order (the order the train rule lists them), else sorted."""
    plan = results / "plan" / "plan.json"
    if plan.is_file():
        ids = [shard["shard"] for shard in json.loads(plan.read_text())["shards"]]
        paths = [str(results / "hidden" / f"shard-{i}.zarr") for i in ids]
        if all(Path(p).is_dir() for p in paths):
            return paths
    return sorted(glob.glob(str(results / "hidden" / "shard-*.zarr")))


def our_training_tokens(shards: list[str], train: dict) -> tuple[int, int]:
    """(tokens, steps): the stored lengths of the samples in the batches our trainer took."""
    from eagleflow.loader import TrainBatches, list_samples, window_tokens

    refs = list_samples(shards, train["heldout_fraction"], "train")
    batches = TrainBatches(
        refs,
        batch_tokens=train["batch_tokens"],
        seed=train["seed"],
        num_steps=train["steps"],
        window=window_tokens(shards),
    )
    tokens = steps = 0
    for batch in batches:
        tokens += sum(refs[i].num_tokens for i in batch)
        steps += 1
    return tokens, steps


def write_peer_data(shards: list[str], vocab: Path, out: Path, heldout_fraction: float) -> dict:
    """Our shards in speculators' offline layout (see the module docstring); rows 0..n-1 are our
    training split, the rest our held-out split. Skipped when `out` already holds them."""
    from safetensors.torch import save_file

    from eagleflow.loader import list_samples
    from eagleflow.shards import open_shard
    from eagleflow.vocab import load_vocab_map

    train = list_samples(shards, heldout_fraction, "train")
    heldout = list_samples(shards, heldout_fraction, "heldout")
    aux_ids = list(open_shard(shards[0]).attrs["aux_layer_ids"])
    d2t, t2d = load_vocab_map(vocab)
    info = {
        "shards": [str(Path(s).resolve()) for s in shards],
        "heldout_fraction": heldout_fraction,
        "train_samples": len(train),
        "heldout_samples": len(heldout),
        "train_lengths": [r.num_tokens for r in train],
        "aux_layer_ids": aux_ids,
        "draft_vocab_size": len(d2t),
    }
    marker = out / "eagleflow_conversion.json"
    if marker.is_file() and json.loads(marker.read_text()) == info:
        print(f"peer data: reusing {out}")
        return info
    if out.exists():
        shutil.rmtree(out)
    (out / "hidden_states").mkdir(parents=True)
    row = {(r.shard, r.index): i for i, r in enumerate([*train, *heldout])}
    ids, masks, lengths = [None] * len(row), [None] * len(row), [0] * len(row)
    for s, path in enumerate(shards):
        for index, sample in enumerate(open_shard(path).iter_samples()):
            i = row[(s, index)]
            hidden = torch.cat([sample["aux"], sample["last"][:, None]], dim=1)  # [T, A+1, H]
            save_file(
                {"hidden_states": hidden.contiguous(), "token_ids": sample["input_ids"]},
                str(out / "hidden_states" / f"hs_{i}.safetensors"),
            )
            ids[i], masks[i] = sample["input_ids"], sample["loss_mask"].to(torch.int64)
            lengths[i] = len(sample["input_ids"])
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    save_file(
        {"input_ids": torch.cat(ids), "loss_mask": torch.cat(masks), "offsets": offsets},
        str(out / ROWS_FILE),
    )
    size = len(d2t)
    np.save(out / f"d2t-{size}.npy", d2t.numpy())
    np.save(out / f"t2d-{size}.npy", t2d.numpy())
    marker.write_text(json.dumps(info))
    print(f"peer data: {len(train)} training + {len(heldout)} held-out samples -> {out}")
    return info


# ---------------------------------------------------------------------------------------------
# The peer's side, run in a child process with the peer package on its path.


def datasets_stand_in() -> types.ModuleType:
    """A module named `datasets` with what speculators' EAGLE-3 offline path uses of it."""
    from safetensors.torch import load_file

    module = types.ModuleType("datasets")

    class Rows:
        """Token rows (input_ids, loss_mask, seq_len) in torch format, like a `datasets`
        Dataset saved by speculators' preprocessing with set_format("torch")."""

        def __init__(self, tensors: dict, index: list[int]) -> None:
            self.tensors, self.index = tensors, index

        def __len__(self) -> int:
            return len(self.index)

        def select(self, indices) -> Rows:
            return Rows(self.tensors, [self.index[i] for i in indices])

        def with_format(self, _format=None) -> Rows:
            return self

        def _span(self, i: int) -> tuple[int, int]:
            offsets = self.tensors["offsets"]
            return int(offsets[i]), int(offsets[i + 1])

        def __getitem__(self, key):
            if isinstance(key, str):
                if key != "seq_len":
                    raise KeyError(key)
                return [b - a for a, b in map(self._span, self.index)]
            a, b = self._span(self.index[key])
            return {
                "input_ids": self.tensors["input_ids"][a:b],
                "loss_mask": self.tensors["loss_mask"][a:b],
                "seq_len": b - a,
            }

    def load_from_disk(path, *args, **kwargs) -> Rows:
        tensors = load_file(str(Path(path) / ROWS_FILE))
        return Rows(tensors, list(range(len(tensors["offsets"]) - 1)))

    def unavailable(*args, **kwargs):
        raise NotImplementedError("the `datasets` stand-in only reads rows written by peer.py")

    module.Dataset = Rows
    module.load_from_disk = load_from_disk
    module.load_dataset = unavailable
    module.concatenate_datasets = unavailable
    return module


def patch_speculators_for_cpu() -> None:
    """The patches listed in the module docstring; applied before speculators is imported."""
    from eagleflow.precision import native_bf16

    sys.modules["datasets"] = datasets_stand_in()
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    original_init = trainer.Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    if native_bf16("cpu"):
        trainer.Trainer.__init__ = init_on_cpu


def peer_schedule(lengths: list[int], total_seq_len: int, seed: int, budget: int) -> dict:
    """Epochs and steps of the peer's own batch sampler until it has consumed `budget` tokens
    (the first step that reaches it); its batches as its trainer will draw them."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=total_seq_len, lengths=lengths, num_replicas=1, rank=0, seed=seed
    )
    tokens = steps = epoch = 0
    while True:
        batches = sampler._generate_batches(epoch)
        if not batches:
            raise ValueError("the peer's sampler made no batch from the training split")
        for batch in batches:
            tokens += min(int(sampler.lengths[batch].sum()), total_seq_len)
            steps += 1
            if tokens >= budget:
                return {"epochs": epoch + 1, "max_steps": steps, "tokens": tokens}
        epoch += 1


def child_main(spec_file: str) -> None:
    """Train the peer as `speculators train` would, with the CPU patches."""
    spec = json.loads(Path(spec_file).read_text())
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    patch_speculators_for_cpu()
    import importlib.metadata

    import speculators.train.cli as cli

    cli.resolve_draft_intermediate_size = lambda verifier_config: spec["intermediate_size"]

    schedule = peer_schedule(
        spec["train_lengths"], spec["total_seq_len"], spec["seed"], spec["budget"]
    )
    out = Path(spec["out"])
    (out / SCHEDULE_FILE).write_text(
        json.dumps({**schedule, "version": importlib.metadata.version("speculators")})
    )
    print(f"peer schedule: {schedule}", flush=True)
    argv = [
        "--speculator-type", "eagle3",
        "--verifier-name-or-path", spec["target"],
        "--data-path", spec["data"],
        "--save-path", str(out / "checkpoints"),
        "--log-dir", str(out / "logs"),
        "--target-layer-ids", *map(str, spec["aux_layer_ids"]),
        "--draft-vocab-size", str(spec["draft_vocab_size"]),
        "--total-seq-len", str(spec["total_seq_len"]),
        "--train-data-ratio", repr(spec["train_data_ratio"]),
        "--epochs", str(schedule["epochs"]),
        "--max-steps", str(schedule["max_steps"]),
        "--seed", str(spec["seed"]),
        "--on-missing", "raise",
        "--num-workers", "0",
        "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager",
        "--log-freq", str(spec["log_freq"]),
        "--no-resume-from-checkpoint",
    ]  # fmt: skip
    print("speculators train " + " ".join(argv), flush=True)
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    main(TrainConfig.resolve(argv))


def train_peer(
    args, info: dict, data: Path, budget: int, train: dict, target: Path, width: int
) -> Path:
    """Run the peer's trainer (child process), its MLP `width` wide, and copy its last
    checkpoint to an export dir."""
    out = args.work / "peer"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    n_train, n_all = info["train_samples"], info["train_samples"] + info["heldout_samples"]
    spec = {
        "target": str(target.resolve()),
        "data": str(data),
        "out": str(out),
        "aux_layer_ids": info["aux_layer_ids"],
        "draft_vocab_size": info["draft_vocab_size"],
        "train_lengths": info["train_lengths"],
        "total_seq_len": train["batch_tokens"],
        # speculators splits at int(len * ratio): exactly our training rows.
        "train_data_ratio": (n_train + 0.5) / n_all,
        "seed": train["seed"],
        "budget": budget,
        "intermediate_size": width,
        "threads": args.threads,
        "log_freq": args.log_freq,
    }
    spec_file = out / "spec.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.peer_path), env.get("PYTHONPATH")]))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_file)],
        check=True,
        env=env,
    )
    checkpoints = out / "checkpoints"
    epochs = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit() and p.is_dir()]
    last = checkpoints / str(max(epochs))
    export = out / "export"
    export.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(last / name, export / name)
    state = last / "training_state.json"
    schedule = json.loads((out / SCHEDULE_FILE).read_text())
    if state.is_file():
        schedule["global_step"] = json.loads(state.read_text()).get("global_step")
    (export / SCHEDULE_FILE).write_text(json.dumps(schedule))
    return export


# ---------------------------------------------------------------------------------------------


def drafter_width(export: Path) -> int:
    """intermediate_size of an export, ours (flat config) or speculators' (layer config)."""
    config = json.loads((export / "config.json").read_text())
    return config.get("transformer_layer_config", config)["intermediate_size"]


def table_rows(f: dict) -> list[Row]:
    widths = f.get("intermediate_size")
    rows = [
        *([Row("drafter MLP width (intermediate_size), ours / peer",
               f"{widths['ours']} / {widths['peer']}", key="intermediate_size")]
          if widths else []),
        Row("tokens our trainer consumed (train.steps batches of TrainBatches)",
            f"{f['our_tokens']:,} in {f['our_steps']} steps", key="our_tokens"),
        Row("tokens the peer consumed (its sampler, --total-seq-len = train.batch_tokens)",
            f"{f['peer_tokens']:,} in {f['peer_steps']} steps ({f['peer_epochs']} epochs)"
            if f.get("peer_tokens") else "unknown (reused export without peer_run.json)",
            key="peer_tokens"),
    ]  # fmt: skip
    for k in f["ks"]:
        ours, peer = f["served"]["ours"][str(k)], f["served"]["peer"][str(k)]
        rows.append(Row(f"served mean acceptance length, K={k}, ours / peer",
                        f"{ours:.3f} / {peer:.3f}", key=f"served.*.{k}"))  # fmt: skip
        ratio = ours / peer
        if k in GOAL_KS:
            rows.append(goal_row(f"ours / peer, served, K={k}", ratio, GOAL_RATIO, f"ratio.{k}"))
        else:
            rows.append(Row(f"ours / peer, served, K={k}", f"{ratio:.2f}", key=f"ratio.{k}"))
    method = f.get("draft_sample_method", "greedy")
    drafts = "" if method == "greedy" else f" ({method} drafts)"
    for t, served in (f.get("served_sampled") or {}).items():
        for k in f["ks"]:
            ours, peer = served["ours"][str(k)], served["peer"][str(k)]
            rows += [
                Row(f"served mean acceptance length, K={k}, T={t}{drafts}, ours / peer",
                    f"{ours:.3f} / {peer:.3f}", key=f"served_sampled.{t}.*.{k}"),
                Row(f"ours / peer, served, K={k}, T={t}{drafts}", f"{ours / peer:.2f}"),
            ]  # fmt: skip
    for k, positions in (f.get("served_positions") or {}).items():
        ours, peer = positions["ours"], positions["peer"]
        rows.append(Row(
            f"served acceptance rate by draft position, K={k}, ours / peer (each: the share of "
            "drafts accepted at that position; in brackets, given the one before was)",
            ", ".join(f"{a:.3f} / {b:.3f} ({a / pa:.3f} / {b / pb:.3f})" for a, b, pa, pb
                      in zip(ours, peer, [1.0, *ours], [1.0, *peer], strict=False)),
            key=f"served_positions.{k}.*",
        ))  # fmt: skip
    for k, value in (f.get("offline_ours") or {}).items():
        rows.append(Row(f"offline mean acceptance length of ours, K={k}", f"{value:.3f}",
                        key=f"offline_ours.{k}"))  # fmt: skip
    return rows


def seed_mean_rows(stored: list[Path]) -> list[Row]:
    """Both drafters' served acceptance averaged over stored runs of this bench (one per train
    seed), read from their `served.*.K` rows, and ours / peer of those means."""
    served: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (K, T) -> per run
    for path in stored:
        for row in load(path)["rows"]:
            if match := re.fullmatch(r"served(?:_sampled\.([\d.]+))?\.\*\.(\d+)", row.key):
                ours, peer = (float(x) for x in row.value.split(" / "))
                k, t = match.group(2), match.group(1) or "0.0"
                served.setdefault((k, t), []).append((ours, peer))
    rows = []
    for (k, t), pairs in served.items():
        ours, peer = (statistics.fmean(side) for side in zip(*pairs, strict=True))
        runs = f"{len(pairs)} runs"
        at = f"K={k}" if t == "0.0" else f"K={k}, T={t}"
        key = k if t == "0.0" else f"{k}.T{t}"
        rows += [
            Row(f"served mean acceptance length, {at}, ours / peer, each run",
                ", ".join(f"{a:.3f} / {b:.3f}" for a, b in pairs), key=f"served.*.{key}"),
            Row(f"served mean acceptance length, {at}, ours / peer, mean of {runs}",
                f"{ours:.3f} / {peer:.3f}", key=f"mean.*.{key}"),
        ]  # fmt: skip
        # Three decimals: the means of a few runs sit near the goal. The goal is greedy's.
        gated = int(k) in GOAL_KS and t == "0.0"
        rows.append(Row(f"ours / peer, served, {at}, means of {runs}", f"{ours / peer:.3f}",
                        f">= {GOAL_RATIO:g}" if gated else "",
                        ours / peer >= GOAL_RATIO if gated else None, f"ratio.{key}"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mean-of", type=Path, nargs="+",
        help="stored rows of runs of this bench (one per train seed): print and store their "
        "means instead of training and serving",
    )  # fmt: skip
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--config", type=Path, default=REPO / "config.yaml",
                        help="the workflow config our drafter was trained with")  # fmt: skip
    parser.add_argument("--ours", type=Path, help="our export (default RESULTS/drafter/vllm)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "eagleflow-peer",
                        help="converted data and the peer's run (outside the repo)")  # fmt: skip
    parser.add_argument("--peer-path", type=Path, default=Path("/tmp/peer"),
                        help="where speculators 0.9.0 was installed with pip --target")  # fmt: skip
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="train the peer on this fraction of our tokens (smoke runs)",
    )
    budget.add_argument(
        "--max-tokens-trained",
        type=int,
        help="train the peer on at most this many tokens (smoke runs)",
    )
    parser.add_argument(
        "--reuse-peer",
        type=Path,
        help="a peer export (config.json + model.safetensors): skip training",
    )
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5])
    parser.add_argument(
        "--sampled", type=float, nargs="*", default=[1.0],
        help="temperatures also served (seeded), beside greedy: how the drafters compare when "
        "the target is served sampled (the goal is greedy's)",
    )  # fmt: skip
    from eagleflow.sampled import DRAFT_SAMPLE_METHODS

    parser.add_argument(
        "--draft-sample-method", choices=DRAFT_SAMPLE_METHODS, default="greedy",
        help="how vLLM drafts at the sampled temperatures (evaluate.draft_sample_method)",
    )  # fmt: skip
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--no-offline", action="store_true", help="skip the offline acceptance of ours"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of the peer's trainer (0: torch's choice)",
    )
    parser.add_argument("--log-freq", type=int, default=10)
    output_arguments(parser, "peer")
    args = parser.parse_args()
    if args.mean_of:
        title = f"Ours vs speculators {PEER_VERSION} (peer recipe, equal tokens), seed means"
        finish(args, title, seed_mean_rows(args.mean_of))
        return

    config = yaml.safe_load(args.config.read_text())
    train = config["train"]
    results = args.results
    ours = args.ours or results / "drafter" / "vllm"
    target = Path(config["target"]["model"] or results / "demo" / "target")
    shards = shard_paths(results)
    if not shards:
        sys.exit(f"no shards under {results / 'hidden'}")
    heldout = train["heldout_fraction"]

    our_tokens, our_steps = our_training_tokens(shards, train)
    budget = our_tokens
    if args.max_tokens_trained:
        budget = min(budget, args.max_tokens_trained)
    elif args.steps_scale != 1.0:
        budget = int(our_tokens * args.steps_scale)
    padded = train["batch_tokens"]
    print(f"tokens our trainer consumed: {our_tokens:,} ({our_steps} steps of <= {padded} "
          f"padded tokens)" + ("" if args.reuse_peer else f"; peer budget: {budget:,}"),
          flush=True)  # fmt: skip

    if args.reuse_peer:
        peer = args.reuse_peer
    else:
        if not (args.peer_path / "speculators").is_dir():
            sys.exit(f"speculators is not installed under {args.peer_path}: run\n  "
                     f"{sys.executable} -m pip install --no-deps --target {args.peer_path} "
                     f"speculators=={PEER_VERSION} hs-connectors=={PEER_VERSION}")  # fmt: skip
        data = args.work / "data"
        info = write_peer_data(shards, results / "vocab" / "vocab.safetensors", data, heldout)
        peer = train_peer(args, info, data, budget, train, target, drafter_width(ours))
    schedule_file = peer / SCHEDULE_FILE
    schedule = json.loads(schedule_file.read_text()) if schedule_file.is_file() else {}
    peer_tokens = f"{schedule['tokens']:,}" if "tokens" in schedule else "unknown"
    print(f"tokens the peer consumed: {peer_tokens} ({schedule.get('max_steps')} steps, "
          f"{schedule.get('epochs')} epochs); ours: {our_tokens:,}", flush=True)  # fmt: skip

    from eagleflow.evaluate import offline_acceptance
    from eagleflow.serving_check import serving_acceptance

    offline = {}
    if not args.no_offline:
        report = offline_acceptance(ours, shards, target, heldout_fraction=heldout, ks=args.ks)
        offline = {k: v["mean_acceptance_length"] for k, v in report["by_k"].items()}
    # By temperature, then drafter, then K; greedy first (the goal), then the sampled ones.
    by_temperature: dict[str, dict[str, dict[str, float]]] = {}
    positions: dict[str, dict[str, list[float]]] = {}  # greedy: K -> drafter -> per position
    for k in args.ks:
        for name, export in (("ours", ours), ("peer", peer)):
            report = serving_acceptance(
                export, shards, target, heldout_fraction=heldout, k=k,
                max_tokens=args.max_tokens, max_model_len=1024, max_prompts=args.prompts,
                temperatures=[0.0, *(t for t in args.sampled if t > 0)], compare_plain=False,
                draft_sample_method=args.draft_sample_method,
            )  # fmt: skip
            positions.setdefault(str(k), {})[name] = report["by_temperature"]["0.0"]["per_position"]
            for t, at_t in report["by_temperature"].items():
                length = at_t["mean_acceptance_length"]
                by_temperature.setdefault(t, {"ours": {}, "peer": {}})[name][str(k)] = length
                print(f"served K={k} T={t} {name}: {length:.3f} ({report['prompts']} prompts)",
                      flush=True)  # fmt: skip
    served = by_temperature.pop("0.0")
    figures = {
        "ks": args.ks,
        "our_tokens": our_tokens,
        "our_steps": our_steps,
        "peer_budget": budget,
        "peer_tokens": schedule.get("tokens"),
        "peer_steps": schedule.get("max_steps"),
        "peer_epochs": schedule.get("epochs"),
        "peer_global_step": schedule.get("global_step"),
        "peer_version": schedule.get("version"),
        "peer_export": str(peer),
        "intermediate_size": {
            name: drafter_width(export) for name, export in (("ours", ours), ("peer", peer))
        },
        "served": served,
        "served_sampled": by_temperature,
        "served_positions": positions,
        "draft_sample_method": args.draft_sample_method,
        "ratio": {str(k): served["ours"][str(k)] / served["peer"][str(k)] for k in args.ks},
        "offline_ours": offline,
        "prompts": args.prompts,
    }
    note = ""
    if schedule.get("tokens", 0) < our_tokens:
        note = f"not equal tokens: the peer trained on {peer_tokens} of our {our_tokens:,}"
    finish(args, f"Ours vs speculators {PEER_VERSION} (peer recipe, equal tokens)",
           table_rows(figures), figures, note=note)  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
    else:
        main()
