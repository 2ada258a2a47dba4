"""Recipe ablations: the drafter trained under one token budget and seed with each candidate
change to the recipe, judged held out, offline and served in vLLM, in one run.

Every variant starts from the original EAGLE-3 recipe (BASE: random lm_head, no extra norms,
AdamW, cosine decay, 7 TTT steps weighted 0.8^k) with the finished run's other train settings
(batch, learning rate, warmup, seed), and changes one thing, except the rows that combine
them ("combined*"). Per variant: held-out acc_0..2 (the trainer's own evaluation), offline and
served mean acceptance length at K=3 and K=5 (served: the held-out prompts in vLLM, greedy, the same
prompts for every variant), and the training seconds. "configured" trains the run's
config.yaml recipe as it is.

    .venv/bin/python bench/recipes.py --results results                 # the run's own budget
    .venv/bin/python bench/recipes.py --results results --steps 400     # a third of it
    .venv/bin/python bench/recipes.py --results results --only muon,configured
    .venv/bin/python bench/recipes.py --results results --steps 400 --full-budget configured

--full-budget names variants also trained at the run's own budget (rows "NAME@full"), in the
same table: whether a change measured on the short budget holds on the long one. --seeds trains
every row again per seed (rows "NAME#seedN") and adds the mean: one training's own spread is
about the size of the differences between good recipes (served K=3: 3.48 to 3.54 over three
seeds of the default).

    .venv/bin/python bench/recipes.py --results results --only configured --seeds 0,1,2 \
        --rows bench/figures/recipes.seeds.json

Each variant's export and figures stay under --out (default RESULTS/bench/recipes/NAME); a
variant whose figures exist for the same settings and training code is read back, not trained
again (--fresh retrains).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from dataclasses import asdict, fields
from pathlib import Path

import yaml
from rows import Row, finish, finished_run, output_arguments

from eagleflow.checkpoints import training_code
from eagleflow.evaluate import offline_acceptance
from eagleflow.serving_check import serving_acceptance
from eagleflow.train import TrainSettings, train_drafter

# The original EAGLE-3 recipe, which every ablation row changes in one place.
BASE = {
    "norm_before_fc": False,
    "norm_before_residual": False,
    "norm_output": False,
    "intermediate_scale": 1.0,
    "lm_head_init": "random",
    "freeze_lm_head": False,
    "optimizer": "adamw",
    "lr_schedule": "cosine",
    "ttt_steps": 7,
    "step_weight": 0.8,
    "ema_decay": 0.0,
}
# The recipe of vLLM's speculators 0.9.0 trainer, as its flags map onto ours.
PEER = {
    "norm_before_fc": True,
    "norm_before_residual": True,
    "norm_output": True,
    "lm_head_init": "target",
    "freeze_lm_head": True,
    "optimizer": "muon",
    "ttt_steps": 3,
    "step_weight": 1.0,
}
# The single changes that won, combined; then changes tried on top of that (a smaller batch
# at the same tokens takes more steps). The default (config.yaml) is COMBINED with step_weight
# 0.4: the row "combined_step_weight_0.4".
COMBINED = {
    "norm_before_fc": True,
    "norm_before_residual": True,
    "lm_head_init": "target",
    "optimizer": "muon",
}
# The default recipe: COMBINED, steps weighted 0.4^k, cosine decay to 0.
DEFAULT = COMBINED | {"step_weight": 0.4, "min_lr_ratio": 0.0}
VARIANTS: dict[str, dict] = {
    "base": {},
    "lm_head_target": {"lm_head_init": "target"},
    "lm_head_target_frozen": {"lm_head_init": "target", "freeze_lm_head": True},
    "norm_before_fc": {"norm_before_fc": True},
    "norm_output": {"norm_output": True},
    "norm_before_residual": {"norm_before_residual": True},
    "ttt3_equal": {"ttt_steps": 3, "step_weight": 1.0},
    "ttt5": {"ttt_steps": 5},
    "step_weight_1": {"step_weight": 1.0},
    "linear_decay": {"lr_schedule": "linear"},
    "constant_lr": {"lr_schedule": "constant"},
    "muon": {"optimizer": "muon"},
    "peer_flags": PEER,
    "combined": COMBINED,
    "combined_norm_output": COMBINED | {"norm_output": True},
    "combined_step_weight_0.6": COMBINED | {"step_weight": 0.6},
    "combined_step_weight_0.4": COMBINED | {"step_weight": 0.4},
    "combined_sw0.6_lr_0.01": COMBINED | {"step_weight": 0.6, "learning_rate": 0.01},
    "combined_sw0.6_wd_0.1": COMBINED | {"step_weight": 0.6, "weight_decay": 0.1},
    "combined_sw0.3": COMBINED | {"step_weight": 0.3},
    "combined_sw0.4_wd_0.1": COMBINED | {"step_weight": 0.4, "weight_decay": 0.1},
    "combined_sw0.4_batch_1024": COMBINED | {"step_weight": 0.4, "batch_tokens": 1024},
    "combined_sw0.4_batch_1024_ttt5": COMBINED
    | {"step_weight": 0.4, "batch_tokens": 1024, "ttt_steps": 5},
    "combined_sw0.4_batch_512": COMBINED | {"step_weight": 0.4, "batch_tokens": 512},
    "combined_sw0.4_lr_0.0075": COMBINED | {"step_weight": 0.4, "learning_rate": 0.0075},
    "combined_sw0.4_min_lr_0": COMBINED | {"step_weight": 0.4, "min_lr_ratio": 0.0},
    "combined_sw0.4_min_lr_0.1": COMBINED | {"step_weight": 0.4, "min_lr_ratio": 0.1},
    "combined_sw0.4_batch_1024_min_lr_0": COMBINED
    | {"step_weight": 0.4, "batch_tokens": 1024, "min_lr_ratio": 0.0},
    # Changes tried on top of the default (config.yaml as of session 19).
    "default_lr_0.0035": DEFAULT | {"learning_rate": 0.0035},
    "default_ema_0.995": DEFAULT | {"ema_decay": 0.995},
    "default_ema_0.995_wd_0.1": DEFAULT | {"ema_decay": 0.995, "weight_decay": 0.1},
    "default_ema_0.995_wd_0.3": DEFAULT | {"ema_decay": 0.995, "weight_decay": 0.3},
    # The drafter MLP twice the target's width: +0.4% at K=3 over three seeds, and the peer
    # gains more at that width (bench/RESULTS.md "drafter MLP width"); not adopted.
    "default_mlp_x2": DEFAULT | {"intermediate_scale": 2.0},
    # The peer's own choices one at a time on top of the default: is one of them where its K=3
    # comes from? (bench/RESULTS.md "the peer's choices one at a time"; none is.)
    "default_norm_output": DEFAULT | {"norm_output": True},
    "default_frozen_lm_head": DEFAULT | {"freeze_lm_head": True},
    "default_ttt3": DEFAULT | {"ttt_steps": 3},
    "configured": None,  # the run's config.yaml train section as it is
}
SERVED_KS = (3, 5)
READ_BACK: list[str] = []  # variants whose figures an earlier run of this code stored
# Settings that say where things are, not how the drafter is trained.
PLACES = ("shards", "vocab", "target", "out_vllm", "out_speculators", "metrics", "checkpoint_dir")


def settings_for(
    run: Path,
    overrides: dict | None,
    steps: int | None,
    out: Path,
    seed: int | None = None,
    threads: int = 0,
) -> TrainSettings:
    train = yaml.safe_load((run / "config.yaml").read_text()).get("train", {})
    known = {f.name for f in fields(TrainSettings)}
    values = {k: v for k, v in train.items() if k in known}
    values |= {"eval_every": 0, "checkpoint_every": 10**9}
    values["threads"] = threads or os.cpu_count() or 1
    if seed is not None:
        values["seed"] = seed
    budget = (steps or values.get("steps", TrainSettings.steps)) * values.get(
        "batch_tokens", TrainSettings.batch_tokens
    )
    if overrides is not None:
        values |= BASE | overrides
    if steps or "batch_tokens" in (overrides or {}):
        # Every variant sees the run's token budget: a smaller batch takes more steps.
        values["steps"] = budget // values["batch_tokens"]
        values["warmup_steps"] = min(values.get("warmup_steps", 100), values["steps"] // 10)
    results = run / "results"
    return TrainSettings(
        **values,
        shards=sorted(glob.glob(str(results / "hidden/shard-*.zarr"))),
        vocab=str(results / "vocab/vocab.safetensors"),
        target=str(results / "demo/target"),
        out_vllm=str(out / "vllm"),
        out_speculators=str(out / "speculators"),
        metrics=str(out / "metrics.tsv"),
        checkpoint_dir=str(out / "checkpoints"),
    )


def measure(s: TrainSettings, args: argparse.Namespace) -> dict:
    recipe = {k: v for k, v in asdict(s).items() if k not in PLACES}
    record = Path(s.out_vllm).parent / "figures.json"
    if record.is_file() and not args.fresh:
        figures = json.loads(record.read_text())
        if figures["settings"] == recipe and figures.get("code") == training_code():
            print(f"{record}: read back", flush=True)
            READ_BACK.append(record.parent.name)
            return figures
    start = time.perf_counter()
    heldout = train_drafter(s)
    train_seconds = time.perf_counter() - start
    common = {"heldout_fraction": s.heldout_fraction}
    offline = offline_acceptance(s.out_vllm, s.shards, s.target, ks=list(SERVED_KS), **common)
    served = {
        k: serving_acceptance(
            s.out_vllm, s.shards, s.target, k=k, max_tokens=args.max_tokens, max_model_len=1024,
            max_prompts=args.prompts, compare_plain=False, **common,
        )["mean_acceptance_length"]
        for k in SERVED_KS
    }  # fmt: skip
    figures = {
        "settings": recipe,
        "code": training_code(),  # figures stored by other code are not read back
        "train_seconds": round(train_seconds, 1),
        "heldout": {f"acc_{k}": heldout[f"acc_{k}"] for k in range(min(3, s.ttt_steps))},
        "offline": {k: offline["by_k"][str(k)]["mean_acceptance_length"] for k in SERVED_KS},
        "served": served,
    }
    record.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def table_rows(by_variant: dict[str, dict]) -> list[Row]:
    rows = []
    for name, f in by_variant.items():
        acc = ", ".join(f"{v:.3f}" for v in f["heldout"].values())
        offline = " / ".join(f"{float(v):.3f}" for v in f["offline"].values())
        served = " / ".join(f"{float(v):.3f}" for v in f["served"].values())
        value = (
            f"acc_0.. {acc}; offline K=3/5 {offline}; served K=3/5 {served}; "
            f"train {f['train_seconds']:.0f} s"
        )
        rows.append(Row(name, value, key=name))
    return rows


def mean_figures(runs: list[dict]) -> dict:
    """The per-seed figures averaged, field by field."""

    def average(key: str) -> dict:
        return {k: sum(float(r[key][k]) for r in runs) / len(runs) for k in runs[0][key]}

    seconds = sum(r["train_seconds"] for r in runs) / len(runs)
    return {"settings": runs[0]["settings"] | {"seed": "mean"}, "train_seconds": seconds} | {
        key: average(key) for key in ("heldout", "offline", "served")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=Path("results"),
        help="a finished run's results/ (its config.yaml beside it; default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the run's)")
    parser.add_argument("--only", help="comma-separated variant names (default: all)")
    parser.add_argument(
        "--full-budget", default="", help="comma-separated variants also trained at the run's steps"
    )
    parser.add_argument(
        "--seeds", default="",
        help="comma-separated seeds: every run again per seed (rows NAME#seedN), and a mean row",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--out", type=Path, help="default: RUN/results/bench/recipes")
    parser.add_argument("--fresh", action="store_true", help="retrain stored variants")
    output_arguments(parser, "recipes")
    args = parser.parse_args()

    try:
        run = finished_run("results/drafter/vllm")(str(args.results.resolve().parent))
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    out = args.out or run / "results/bench/recipes"
    names = args.only.split(",") if args.only else list(VARIANTS)
    full = [name for name in args.full_budget.split(",") if name]
    unknown = sorted(set(names + full) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    runs = [(name, name, args.steps) for name in names]
    runs += [(f"{name}@full", name, None) for name in full]
    seeds = [int(seed) for seed in args.seeds.split(",") if seed] or [None]
    by_variant = {}
    for base_key, name, steps in runs:
        for seed in seeds:
            key = base_key if seed is None else f"{base_key}#seed{seed}"
            print(f"== {key}: {VARIANTS[name] if VARIANTS[name] is not None else 'config.yaml'}")
            settings = settings_for(run, VARIANTS[name], steps, out / key, seed, args.threads)
            by_variant[key] = measure(settings, args)
            print(json.dumps(by_variant[key]), flush=True)
        if len(seeds) > 1:
            by_variant[f"{base_key} (mean of seeds {args.seeds})"] = mean_figures(
                [by_variant[f"{base_key}#seed{seed}"] for seed in seeds]
            )
    title = "Recipe ablations" + (f", seeds {args.seeds}" if len(seeds) > 1 else "")
    notes = []
    if READ_BACK:
        notes.append(f"Read back from {out} (stored by an earlier run of the same code and "
                     f"settings): {', '.join(READ_BACK)}.")  # fmt: skip
    if args.threads:
        notes.append(f"Trained with {args.threads} torch thread(s) per training.")
    finish(args, title, table_rows(by_variant), by_variant, note=" ".join(notes))


if __name__ == "__main__":
    main()
