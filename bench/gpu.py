"""GPU variant of the extraction and training benches, side by side in one run.

For a machine with a GPU but without vLLM (whose GPU build is too large to carry here): the hf
extraction backend and the drafter training, the same code that runs on CPU, following the
device the tensors live on.

  (b) hf extraction of a demo shard into a compressed zarr shard (`extract_shard`, backend hf);
  (c) the naive loop on the same GPU: one sample at a time, `output_hidden_states=True`, a
      `torch.save` per sample;
  the hf shard against the CPU vLLM shard of the same samples (`eagleflow.compare`);
  training steps/s and tokens/s of the drafter at two batch sizes (`python -m eagleflow.train`).

Data: a folder with `target/` (the demo target), `tokens.jsonl` (a prepared shard),
`hidden/shard-*.zarr` (its vLLM shard first, then any others for training) and
`vocab.safetensors`.

    python3 bench/gpu.py --data .gpu --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagleflow.compare import compare_shards  # noqa: E402
from eagleflow.extract import extract_shard  # noqa: E402
from eagleflow.files import read_jsonl  # noqa: E402
from eagleflow.layers import default_layer_ids  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def naive_loop(target: Path, tokens: Path, out: Path) -> dict:
    """Baseline (c) on the same device as ours."""
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).to(device).eval()
    aux_ids, _ = default_layer_ids(model.config.num_hidden_layers)
    samples = read_jsonl(tokens)
    out.mkdir(parents=True, exist_ok=True)
    sync()
    start = time.monotonic()
    with torch.inference_mode():
        for sample in samples:
            ids = torch.tensor([sample["input_ids"]], device=device)
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
            aux = torch.stack([states[k][0] for k in aux_ids], dim=1)
            torch.save({"aux": aux.cpu(), "last": states[-1][0].cpu()}, out / f"{sample['id']}.pt")
    sync()
    seconds = time.monotonic() - start
    n_tokens = sum(len(s["input_ids"]) for s in samples)
    return {"tokens": n_tokens, "seconds": round(seconds, 3), "tokens_per_s": n_tokens / seconds}


def train_speed(data: Path, work: Path, steps: int, batch_tokens: int) -> dict:
    """`python -m eagleflow.train` for `steps` steps: steps/s over the whole process (start-up,
    evaluation and export included) and the steady tokens/s the trainer logs."""
    shards = sorted(str(p) for p in (data / "hidden").glob("shard-*.zarr"))
    run = work / f"train-{batch_tokens}"
    settings = {
        "shards": shards,
        "vocab": str(data / "vocab.safetensors"),
        "target": str(data / "target"),
        "out_vllm": str(run / "vllm"),
        "out_speculators": str(run / "speculators"),
        "metrics": str(run / "metrics.tsv"),
        "checkpoint_dir": str(run / "ckpt"),
        "steps": steps,
        "batch_tokens": batch_tokens,
        "checkpoint_every": steps,
        "eval_every": steps,
        "log_every": 10,
        "num_workers": 2,
    }
    run.mkdir(parents=True)
    (run / "settings.json").write_text(json.dumps(settings))
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "eagleflow.train", str(run / "settings.json")],
        check=True,
        cwd=REPO,
    )
    seconds = time.monotonic() - start
    rows = [line.split("\t") for line in (run / "metrics.tsv").read_text().splitlines()[1:]]
    train = [r for r in rows if r[1] == "train"]
    heldout = [r for r in rows if r[1] == "heldout"]
    return {
        "batch_tokens": batch_tokens,
        "steps": steps,
        "seconds": round(seconds, 1),
        "steps_per_s": round(steps / seconds, 2),
        "steady_tokens_per_s": float(train[-1][4]) if train else None,
        "heldout_acc_0": float(heldout[-1][12]) if heldout else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(".gpu"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-tokens", default="2048,16384")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    figures: dict = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    print(figures, flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    target, tokens = args.data / "target", args.data / "tokens.jsonl"
    reference = sorted((args.data / "hidden").glob("shard-*.zarr"))[0]

    extract_shard(tokens, target, work / "warm-up.zarr", backend="hf")  # CUDA start-up, kernels
    ours = extract_shard(tokens, target, work / "hf.zarr", backend="hf")
    naive = naive_loop(target, tokens, work / "naive")
    comparison = compare_shards(work / "hf.zarr", reference)
    figures["extraction"] = {
        "tokens": ours["tokens"],
        "hf_extract_tok_s": ours["tokens_per_s"],
        "naive_tok_s": round(naive["tokens_per_s"]),
        "extract_over_naive": round(ours["tokens_per_s"] / naive["tokens_per_s"], 2),
        "stored_over_raw": round(ours["activation_stored_bytes"] / ours["activation_raw_bytes"], 3),
        "vs_cpu_vllm_shard": {
            "identical_ids": f"{comparison.identical_ids}/{comparison.samples_compared}",
            "max_relative_error": comparison.max_relative_error,
            "within_tolerance": comparison.ok,
        },
    }
    print(json.dumps(figures["extraction"], indent=1), flush=True)

    figures["training"] = [
        train_speed(args.data, work, args.steps, int(b)) for b in args.batch_tokens.split(",")
    ]
    print(json.dumps(figures, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
