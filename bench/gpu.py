"""Extraction and training on a GPU, side by side with the CPU, in one short bounded run.

Made for one lent GPU machine (torch + transformers there; zarr & co. carried as wheels), over a
data folder holding `target/` (the demo target), `tokens/shard-*.jsonl`, the matching
`hidden/shard-*.zarr` (extracted earlier with vLLM on a CPU) and `vocab.safetensors`:

  1. extraction with the hf backend (`extract_shard(..., backend="hf")`, on CUDA when there is
     one) of the token shards (1x), into a temporary zarr shard: tokens/s on the GPU and, for
     the ratio, on this machine's CPU (torch CPU; killed past `--cpu-limit` + 30 seconds); on
     the GPU also of the samples repeated `--repeat` times under new ids (throughput at scale);
     the naive per-sample HF `output_hidden_states` + `torch.save` loop (bench/extraction.py,
     baseline (c)) on the GPU, 1x, for b/c; stored/raw bytes; and the GPU (and CPU) shard
     against the carried vLLM shards, per layer, within the bf16 tolerance of
     tests/test_extract.py (asserted at the end);
  2. training (`eagleflow.train.train_drafter`, the `train` settings of config.yaml) for
     `--steps` steps at the configured batch, and at `--big-batch` tokens (with the configured
     loader workers, then `--big-workers`): steps/s and tokens/s in steady state, the share of
     step time spent waiting for the loader, held-out acc_0 at the end;
  3. torch / CUDA versions and the GPU's name.

Each part runs in a subprocess of its own (a fresh CUDA context, a hard timeout); parts that
would start past `--budget` seconds are skipped. Without CUDA the GPU parts are skipped, unless
`--allow-cpu` runs them on the CPU (to test this script with tiny settings):

    python3 bench/gpu.py --data .gpu --rows $OUT/gpu-rows.json --json $OUT/gpu.json
    .venv/bin/python bench/gpu.py --data .gpu --allow-cpu --repeat 1 --max-samples 40 \
        --steps 5 --big-batch 4096 --cpu-limit 60
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rows import REPO, Row, finish, output_arguments

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

JOBS = ("extract", "naive", "train")
# The tolerance of tests/test_extract.py (vLLM vs HF backends, per layer), in case that module
# cannot be imported here (it needs pytest).
FALLBACK_TOL = 0.035


def say(*parts: object) -> None:
    print(*parts, flush=True)


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- jobs (in subprocesses)


def job_extract(args: argparse.Namespace) -> dict:
    """A warm-up `extract_shard` of a few samples (CUDA context, kernels, allocator), then one
    timed `extract_shard` per token file of `--tokens` (comma-separated) into `--out`/NAME.zarr;
    their summaries by file stem."""
    import torch

    from eagleflow.extract import extract_shard
    from eagleflow.files import read_jsonl

    files = [Path(path) for path in args.tokens.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extract_shard(read_jsonl(files[0])[:16], args.model, out / "warmup.zarr", backend="hf")
    shutil.rmtree(out / "warmup.zarr", ignore_errors=True)
    summaries = {}
    for path in files:
        summary = extract_shard(path, args.model, out / f"{path.stem}.zarr", backend="hf")
        summary["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        summary["torch_threads"] = torch.get_num_threads()
        summaries[path.stem] = summary
    return summaries


def job_naive(args: argparse.Namespace) -> dict:
    """bench/extraction.py's naive loop (baseline (c)) on this process's device, after an
    untimed warm-up pass over a few samples."""
    import torch

    from eagleflow.files import read_jsonl, write_jsonl

    bench = load_module("bench_extraction", REPO / "bench" / "extraction.py")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    warm_tokens = Path(args.out).with_name("naive-warmup.jsonl")
    write_jsonl(warm_tokens, read_jsonl(args.tokens)[:16])
    bench.naive_extract(args.model, warm_tokens, Path(args.out).with_name("naive-warmup"), device)
    result = bench.naive_extract(args.model, args.tokens, args.out, device)
    result["device"] = device
    return result


class TimedLoader:
    """Wraps the trainer's loader: when each batch arrived, how long the step waited for it,
    and its tokens (counted as the trainer counts them)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.arrived: list[float] = []
        self.waited: list[float] = []
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        iterator = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            now = time.perf_counter()
            self.waited.append(now - start)
            self.arrived.append(now)
            self.tokens.append(int(batch["input_ids"].ne(0).sum()) if "input_ids" in batch else 0)
            yield batch


def job_train(args: argparse.Namespace) -> dict:
    """`train_drafter` with the settings in `--settings` (a JSON file), timed step by step."""
    from statistics import median

    import torch

    import eagleflow.train as train

    settings = train.TrainSettings(**json.loads(Path(args.settings).read_text()))
    timed: list[TimedLoader] = []
    make_loader = train.make_loader

    def timed_loader(*a, **k):
        loader = make_loader(*a, **k)
        if timed:  # the held-out evaluation's loaders stay as they are
            return loader
        timed.append(TimedLoader(loader))
        return timed[0]

    train.make_loader = timed_loader
    start = time.perf_counter()
    final = train.train_drafter(settings)
    wall = time.perf_counter() - start
    t = timed[0]
    skip = min(10, max(0, len(t.arrived) - 2))  # warm-up steps left out of the steady state
    # Step n runs from batch n's arrival to batch n+1's; the last step has no end mark.
    span = t.arrived[-1] - t.arrived[skip] if len(t.arrived) > skip + 1 else float("nan")
    steps = len(t.arrived) - 1 - skip
    tokens = sum(t.tokens[skip:-1])
    waited = sum(t.waited[skip + 1 :])
    with open(settings.metrics) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    logged = [float(r[4]) for r in rows if r[1] == "train" and r[4]]
    return {
        "device": str(train.training_device()),
        "steps": settings.steps,
        "batch_tokens": settings.batch_tokens,
        "num_workers": settings.num_workers,
        "precision": settings.precision,
        "wall_seconds": wall,
        "steps_per_s_wall": settings.steps / wall,
        "steady_steps": steps,
        "steady_steps_per_s": steps / span,
        "steady_tokens_per_s": tokens / span,
        "mean_tokens_per_step": tokens / max(steps, 1),
        "loader_wait_share": waited / span,
        "logged_tokens_per_s_median": median(logged[1:] or logged),
        "heldout": final,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
    }


# ---------------------------------------------------------------- orchestration


class Runner:
    """Runs jobs in subprocesses within a global time budget."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work, self.start = args, work, time.monotonic()

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def run(self, job: str, *, cpu: bool, timeout: float, **options: object) -> dict:
        """The job's result, or {"skipped": why}."""
        if self.left() < 15:
            return {"skipped": f"time budget ({self.args.budget:.0f} s) spent"}
        timeout = min(timeout, self.left())
        n = len(list(self.work.glob(f"{job}-*.result.json")))
        result = self.work / f"{job}-{n}.result.json"
        argv = [sys.executable, __file__, "--job", job, "--result", str(result),
                "--model", str(self.args.data / "target")]  # fmt: skip
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_MININTERVAL="5")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = self.work / f"{result.stem}.log"
        started = time.monotonic()
        say(f"-- {job} on {'cpu' if cpu else 'gpu'} {options} (timeout {timeout:.0f} s)")
        with log.open("w") as out:
            try:
                proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                      timeout=timeout)  # fmt: skip
            except subprocess.TimeoutExpired:
                say(f"   {job}: timed out after {timeout:.0f} s")
                return {"skipped": f"timed out after {timeout:.0f} s"}
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            tail = log.read_text()[-2500:]
            say(f"   {job} failed ({proc.returncode}) after {seconds:.0f} s:\n{tail}")
            return {"failed": proc.returncode, "log_tail": tail}
        figures = json.loads(result.read_text())
        figures["job_seconds"] = seconds
        say(f"   done in {seconds:.0f} s")
        return figures


def environment() -> dict:
    import numpy
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in ("zarr", "numcodecs"):
        try:
            info[name] = __import__(name).__version__
        except ImportError as err:
            info[name] = f"missing: {err}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_sms=props.multi_processor_count,
        )
    return info


def tolerance_and_metric():
    """`relative_error` and the backend tolerance of tests/test_extract.py, when importable."""
    try:
        tests = load_module("test_extract", REPO / "tests" / "test_extract.py")
        return tests.relative_error, tests.TOL_BACKENDS, "tests/test_extract.py"
    except Exception as err:  # e.g. no pytest here

        def relative_error(pairs):
            diff = sum(float((a.float() - b.float()).pow(2).sum()) for a, b in pairs)
            ref = sum(float(b.float().pow(2).sum()) for _, b in pairs)
            return (diff / ref) ** 0.5

        return relative_error, FALLBACK_TOL, f"fallback ({err!r})"


def compare(extracted: Path, references: list[Path]) -> dict:
    """Per layer, ||a - b|| / ||b|| of the extracted shard against the reference (vLLM) shards
    over all their samples (the metric of tests/test_extract.py), and the worst per sample."""
    from eagleflow.shards import open_shard

    relative_error, tol, source = tolerance_and_metric()
    shard = open_shard(extracted)
    index = {sample_id: i for i, sample_id in enumerate(shard.sample_ids)}
    pairs = []
    for path in references:
        ref = open_shard(path)
        for i, sample_id in enumerate(ref.sample_ids):
            if sample_id in index:
                pairs.append((shard.sample(index[sample_id]), ref.sample(i)))
    if not pairs:
        return {"skipped": "no common sample ids"}
    ref_attrs = open_shard(references[0]).attrs
    names = [f"aux {k}" for k in ref_attrs["aux_layer_ids"]]
    names.append(f"last {ref_attrs['last_layer_id']}")

    def layer(s: dict, j: int):
        return s["aux"][:, j] if j < len(names) - 1 else s["last"]

    errors, worst = {}, {}
    for j, name in enumerate(names):
        errors[name] = relative_error([(layer(a, j), layer(b, j)) for a, b in pairs])
        worst[name] = max(relative_error([(layer(a, j), layer(b, j))]) for a, b in pairs)
    ids_equal = all(
        a["input_ids"].tolist() == b["input_ids"].tolist()
        and a["loss_mask"].tolist() == b["loss_mask"].tolist()
        for a, b in pairs
    )
    return {
        "samples": len(pairs),
        "tokens": sum(len(a["input_ids"]) for a, _ in pairs),
        "reference_backend": f"{ref_attrs.get('backend')} {ref_attrs.get('backend_version')}",
        "relative_error": errors,
        "worst_sample_relative_error": worst,
        "tolerance": tol,
        "tolerance_from": source,
        "input_ids_and_masks_equal": ids_equal,
        "within_tolerance": ids_equal and max(errors.values()) < tol,
    }


def train_settings(args: argparse.Namespace, work: Path, name: str, **overrides) -> Path:
    """A settings file for `eagleflow.train`: config.yaml's `train` section, then overrides."""
    import dataclasses

    import yaml

    from eagleflow.train import TrainSettings

    config = yaml.safe_load((REPO / "config.yaml").read_text())["train"]
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    run = work / name
    settings = {k: v for k, v in config.items() if k in fields}
    settings.update(
        shards=[str(p) for p in sorted((args.data / "hidden").glob("shard-*.zarr"))],
        vocab=str(args.data / "vocab.safetensors"),
        target=str(args.data / "target"),
        out_vllm=str(run / "vllm"),
        out_speculators=str(run / "speculators"),
        metrics=str(run / "metrics.tsv"),
        checkpoint_dir=str(run / "checkpoints"),
        steps=args.steps,
        eval_every=0,
        checkpoint_every=10**9,
    )
    settings.update(overrides)
    run.mkdir(parents=True, exist_ok=True)
    path = run / "settings.json"
    path.write_text(json.dumps(settings, indent=1))
    return path


def rate(figures: dict, key: str = "tokens_per_s") -> str:
    if key in figures:
        return f"{figures[key]:,.0f}"
    if not figures:
        return "not run"
    return "skipped: " + str(figures.get("skipped") or f"failed ({figures.get('failed')})")


def ratio(a: dict, b: dict, key: str = "tokens_per_s") -> float | None:
    return a[key] / b[key] if key in a and key in b else None


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".gpu"))
    output_arguments(parser, "gpu")
    parser.add_argument("--repeat", type=int, default=8, help="copies of the token shards")
    parser.add_argument("--max-samples", type=int, help="use only the first samples")
    parser.add_argument("--cpu-limit", type=float, default=60, help="s for the CPU extraction")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--big-batch", type=int, default=16384)
    parser.add_argument("--big-workers", type=int, default=4)
    parser.add_argument("--budget", type=float, default=270, help="s for the whole run")
    parser.add_argument("--allow-cpu", action="store_true", help="run GPU parts on the CPU")
    parser.add_argument("--workdir", type=Path, help="keep shards and logs here")
    # Internal: one job, in a subprocess.
    parser.add_argument("--job", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.job:
        job = {"extract": job_extract, "naive": job_naive, "train": job_train}[args.job]
        args.result.write_text(json.dumps(job(args)) + "\n")
        return

    from eagleflow.files import read_jsonl, write_jsonl

    os.environ["HF_HUB_OFFLINE"] = "1"
    args.data = args.data.resolve()
    env = environment()
    say(json.dumps(env))
    gpu = env["cuda_available"]
    run_gpu = gpu or args.allow_cpu
    if not run_gpu:
        say("no CUDA: the GPU parts are skipped (--allow-cpu runs them on the CPU)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(args, work)
    figures: dict = {"environment": env, "settings": {k: str(v) for k, v in vars(args).items()}}

    # 1. Extraction.
    token_files = sorted((args.data / "tokens").glob("shard-*.jsonl"))
    base = [record for path in token_files for record in read_jsonl(path)][: args.max_samples]
    samples = [
        {**s, "id": s["id"] if k == 0 else f"{s['id']}/{k}"}
        for k in range(args.repeat)
        for s in base
    ]
    tokens_1x, tokens_nx = work / "tokens-1x.jsonl", work / f"tokens-{args.repeat}x.jsonl"
    write_jsonl(tokens_1x, base)
    write_jsonl(tokens_nx, samples)
    n_1x = sum(len(s["input_ids"]) for s in base)
    say(f"extraction input: 1x = {len(base)} samples, {n_1x} tokens; {args.repeat}x = "
        f"{len(samples)} samples, {n_1x * args.repeat} tokens; work dir {work}")  # fmt: skip
    ext = figures["extract"] = {"samples_1x": len(base), "tokens_1x": n_1x, "repeat": args.repeat}
    if run_gpu:
        timed = runner.run(
            "extract",
            cpu=not gpu,
            timeout=180,
            out=work / "gpu",
            tokens=f"{tokens_1x},{tokens_nx}" if args.repeat > 1 else tokens_1x,
        )
        ext["gpu"] = timed.get(tokens_1x.stem, timed)
        ext["gpu_repeated"] = timed.get(tokens_nx.stem, timed)
        ext["naive_gpu"] = runner.run("naive", cpu=not gpu, timeout=120, tokens=tokens_1x,
                                      out=work / "naive")  # fmt: skip
    timed = runner.run("extract", cpu=True, timeout=args.cpu_limit + 30, tokens=tokens_1x,
                       out=work / "cpu")  # fmt: skip
    ext["cpu"] = timed.get(tokens_1x.stem, timed)
    if ext["cpu"].get("seconds", 0) > args.cpu_limit:
        ext["cpu"]["over_cpu_limit"] = True
    references = sorted((args.data / "hidden").glob("shard-*.zarr"))
    for name in ("gpu", "cpu"):
        if "path" in ext.get(name, {}):
            ext[f"{name}_vs_vllm"] = compare(Path(ext[name]["path"]), references)
            say(f"{name} hf shard vs carried vLLM shards: {json.dumps(ext[f'{name}_vs_vllm'])}")

    # 2. Training.
    train = figures["train"] = {}
    if run_gpu:
        configured = yaml_train_config()
        runs = [
            ("config", {}),
            ("big", {"batch_tokens": args.big_batch}),
            ("big_workers", {"batch_tokens": args.big_batch, "num_workers": args.big_workers}),
        ]
        for name, overrides in runs:
            if overrides.get("num_workers") == configured.get("num_workers"):
                continue
            settings = train_settings(args, work, f"train-{name}", **overrides)
            train[name] = runner.run("train", cpu=not gpu, timeout=150, settings=settings)
            say(f"   {name}: {json.dumps(train[name])}")

    # Report.
    gpu_ext, cpu_ext = ext.get("gpu", {}), ext["cpu"]
    naive = ext.get("naive_gpu", {})
    device = "CPU (--allow-cpu)" if args.allow_cpu and not gpu else "GPU"
    rows = [
        (f"(b) hf extraction to zarr on {device}, tok/s, 1x", rate(gpu_ext)),
        (f"(b) the same, {args.repeat}x the samples", rate(ext.get("gpu_repeated", {}))),
        ("(b') hf extraction to zarr on this machine's CPU, tok/s, 1x", rate(cpu_ext)),
        ("b / b' (GPU over CPU, 1x)", fmt(ratio(gpu_ext, cpu_ext))),
        (f"(c) naive HF loop + torch.save on {device}, tok/s", rate(naive)),
        ("b / c (1x)", fmt(ratio(gpu_ext, naive))),
    ]
    shard = ext.get("gpu_repeated", {})
    shard = shard if "path" in shard else gpu_ext if "path" in gpu_ext else cpu_ext
    if "path" in shard:
        rows.append(
            (
                "activation bytes/token stored / raw bf16 (ratio)",
                f"{shard['activation_stored_bytes'] / shard['tokens']:.0f} / "
                f"{shard['activation_raw_bytes'] / shard['tokens']:.0f} "
                f"({shard['activation_stored_bytes'] / shard['activation_raw_bytes']:.3f})",
            )
        )
        rows.append(("whole store stored / raw", f"{1 / shard['ratio']:.3f}"))
    for name in ("gpu", "cpu"):
        cmp = ext.get(f"{name}_vs_vllm")
        if cmp and "relative_error" in cmp:
            errs = ", ".join(f"{k} {v:.4f}" for k, v in cmp["relative_error"].items())
            worst = max(cmp["worst_sample_relative_error"].values())
            rows.append(
                (
                    f"{name} hf vs CPU vLLM shard, rel. error per layer (tol {cmp['tolerance']})",
                    f"{errs}; worst sample {worst:.4f}; "
                    f"{'OK' if cmp['within_tolerance'] else 'OUT OF TOLERANCE'}",
                )
            )
    for name, t in train.items():
        if "steady_steps_per_s" in t:
            acc = t["heldout"].get("acc_0")
            value = (
                f"{t['steady_steps_per_s']:.1f} steps/s, {t['steady_tokens_per_s']:,.0f} tok/s "
                f"(loader wait {t['loader_wait_share']:.0%}; wall {t['wall_seconds']:.0f} s; "
                f"held-out acc_0 {fmt(acc, 3)})"
            )
        else:
            value = rate(t, "steady_tokens_per_s")
        label = f"training on {device}, batch {t.get('batch_tokens', name)}"
        rows.append((f"{label}, {t.get('num_workers', '?')} loader worker(s)", value))
    figures["table"] = rows
    figures["seconds"] = time.monotonic() - runner.start
    say(f"\ntotal {figures['seconds']:.0f} s; shards and logs: {work}")
    finish(args, f"Extraction and training on {device}", [Row(*row) for row in rows], figures)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("gpu", "cpu"):
        cmp = ext.get(f"{name}_vs_vllm")
        if cmp and "within_tolerance" in cmp:
            assert cmp["within_tolerance"], f"{name} hf shard differs from the vLLM shard: {cmp}"


def yaml_train_config() -> dict:
    import yaml

    return yaml.safe_load((REPO / "config.yaml").read_text())["train"]


if __name__ == "__main__":
    main()
