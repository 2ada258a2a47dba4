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
same table: whether a change measured on the short budget holds on the long one.

Each variant's export and figures stay under --out (default RESULTS/bench/recipes/NAME); a
variant whose figures exist for the same settings is read back, not trained again (--fresh
retrains).
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

from eagleflow.evaluate import offline_acceptance
from eagleflow.serving_check import serving_acceptance
from eagleflow.train import TrainSettings, train_drafter

# The original EAGLE-3 recipe, which every ablation row changes in one place.
BASE = {
    "norm_before_fc": False,
    "norm_before_residual": False,
    "norm_output": False,
    "lm_head_init": "random",
    "freeze_lm_head": False,
    "optimizer": "adamw",
    "lr_schedule": "cosine",
    "ttt_steps": 7,
    "step_weight": 0.8,
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
    "configured": None,  # the run's config.yaml train section as it is
}
SERVED_KS = (3, 5)
# Settings that say where things are, not how the drafter is trained.
PLACES = ("shards", "vocab", "target", "out_vllm", "out_speculators", "metrics", "checkpoint_dir")


def settings_for(run: Path, overrides: dict | None, steps: int | None, out: Path) -> TrainSettings:
    train = yaml.safe_load((run / "config.yaml").read_text()).get("train", {})
    known = {f.name for f in fields(TrainSettings)}
    values = {k: v for k, v in train.items() if k in known}
    values |= {"eval_every": 0, "checkpoint_every": 10**9, "threads": os.cpu_count() or 1}
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
        if figures["settings"] == recipe:
            print(f"{record}: read back", flush=True)
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
    by_variant = {}
    for key, name, steps in runs:
        print(f"== {key}: {VARIANTS[name] if VARIANTS[name] is not None else 'config.yaml'}")
        settings = settings_for(run, VARIANTS[name], steps, out / key)
        by_variant[key] = measure(settings, args)
        print(json.dumps(by_variant[key]), flush=True)
    finish(args, "Recipe ablations", table_rows(by_variant), by_variant)


if __name__ == "__main__":
    main()
