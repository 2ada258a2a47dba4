"""Hidden-state extraction side by side on the same samples, in one run.

Measures, each job in a subprocess of its own:
  (a) bare vLLM prefill: the extraction engine's settings (in-process engine core, compiled)
      without the extraction, max_tokens=1, a fresh engine per shard as (b) has;
  (b) our vLLM extraction into a compressed zarr shard (`extract_shard`), at 1x and 4x the
      shard size (the 4x shard repeats the samples under new ids);
  (c) a naive HF loop: one sample at a time, `output_hidden_states=True`, `torch.save` per sample;
  (d) server mode: the same shard through one long-running extraction server
      (`python -m eagleflow.extraction_server --extract-layers`), server start excluded.
(a) and (b) run in `--rounds` rounds, their order alternating (this machine is shared and noisy:
one-off ratios moved by 0.1 between runs); their tokens/s and b/a are medians, printed with each
round's ratio. Then (a) and (b) once more as two engines kept running side by side, in
`--warm-pairs` pairs of passes run back to back: each pair shares the moment's noise, so its
b/a is the steady-state ratio with the least noise this machine allows. Prints tokens/s, the
ratios b/a (goal >= 0.90) and b/c (goal >= 3.5), stored activation bytes per token against raw
bf16 (goal <= 0.77) and the peak memory of an extraction job at 1x and 4x (goal: flat), as a
markdown table.

Samples are prompt + response token ids: from `--samples` (a responses JSONL with
prompt_token_ids/response_token_ids, or a prepared tokens JSONL with input_ids/loss_mask), else
from `--prompts` rendered with the target's chat template and answered greedily by vLLM.

    .venv/bin/python bench/extraction.py --model results/demo/target \
        --prompts results/prompts/prompts.jsonl --n 300
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from statistics import median
from typing import Any

import psutil
from rows import MIB, Row, finish, goal_row, joined, output_arguments

from eagleflow.files import read_jsonl, write_jsonl
from eagleflow.shards import DEFAULT_CODEC

JOBS = ("generate", "prefill", "extract", "naive", "server")
GOAL_EXTRACT_OVER_PREFILL = 0.90
GOAL_EXTRACT_OVER_NAIVE = 3.5
GOAL_STORED_OVER_RAW = 0.77
# "Flat" peak memory from a 1x to a 4x shard, as a number: chosen here, not stated elsewhere.
GOAL_RSS_GROWTH = 1.25


def samples_from_records(records: list[dict]) -> list[dict]:
    """Tokens-stage samples from responses records (or tokens records, passed through)."""
    samples = []
    for record in records:
        if "input_ids" in record:
            samples.append({k: record[k] for k in ("id", "input_ids", "loss_mask")})
            continue
        prompt, response = record["prompt_token_ids"], record["response_token_ids"]
        samples.append(
            {
                "id": record["id"],
                "input_ids": prompt + response,
                "loss_mask": [0] * len(prompt) + [1] * len(response),
            }
        )
    return samples


def job_generate(args: argparse.Namespace) -> dict:
    """Answer the prompts greedily and write responses-like records to `--out`."""
    from transformers import AutoTokenizer

    from eagleflow.chat import render_prompt_ids
    from eagleflow.generate import Sampling, generate_vllm

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = read_jsonl(args.prompts)[: args.n]
    prompt_ids = [render_prompt_ids(tokenizer, p["messages"]) for p in prompts]
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    completions = generate_vllm(args.model, prompt_ids, [0] * len(prompt_ids), greedy, 1024)
    records = [
        {"id": f"p{i:05d}", "prompt_token_ids": ids, "response_token_ids": c.token_ids}
        for i, (ids, c) in enumerate(zip(prompt_ids, completions, strict=True))
    ]
    write_jsonl(args.out, records)
    return {"samples": len(records)}


def prefill_engine(model: str, samples: list[dict]) -> Any:
    """The extraction engine's settings (in-process core, compiled), only without the capture."""
    from eagleflow.engine import build_llm

    return build_llm(
        model,
        max_model_len=max(len(s["input_ids"]) for s in samples) + 1,
        in_process_core=True,
        enforce_eager=False,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
    )


def prefill_seconds(llm: Any, samples: list[dict]) -> float:
    """Seconds for one bare prefill of `samples` (max_tokens=1)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=s["input_ids"]) for s in samples]
    start = time.monotonic()
    llm.generate(prompts, params, use_tqdm=False)
    return time.monotonic() - start


def job_prefill(args: argparse.Namespace) -> dict:
    """Bare prefill of `--tokens` in a fresh engine, no extraction: tok/s."""
    samples = read_jsonl(args.tokens)
    seconds = prefill_seconds(prefill_engine(args.model, samples), samples)
    tokens = sum(len(s["input_ids"]) for s in samples)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def warm_worker(kind: str, model: str, tokens: str, encode_threads: int, conn: Connection) -> None:
    """Keep one engine running (`kind`: "prefill" or "extract"); for every shard path received,
    run one pass over `tokens` (an extraction writes the shard, deleted afterwards) and send
    back its seconds, timed as (a) and (b) are; None ends it."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from eagleflow.extract import extract_vllm, new_shard_writer
    from eagleflow.layers import default_layer_ids
    from eagleflow.target_config import target_dims
    from eagleflow.vllm_capture import extraction_engine

    samples = read_jsonl(tokens)
    if kind == "prefill":
        llm = prefill_engine(model, samples)
        while conn.recv() is not None:
            conn.send(prefill_seconds(llm, samples))
        return
    aux_ids, last_id = default_layer_ids(target_dims(model)[0])
    longest = max(len(s["input_ids"]) for s in samples)
    with extraction_engine(model, [*aux_ids, last_id], seed=0, max_model_len=longest + 1) as llm:
        while (out := conn.recv()) is not None:
            with new_shard_writer(
                model, out, backend="vllm", encode_threads=encode_threads
            ) as writer:
                seconds = extract_vllm(model, samples, writer, engine=llm)
                closing = time.monotonic()
            conn.send(seconds + time.monotonic() - closing)  # as extract_shard counts
            shutil.rmtree(out)


def warm_pairs(args: argparse.Namespace, tokens: Path, work: Path) -> dict:
    """b / a from `args.warm_pairs` pairs of passes of two engines kept running side by side,
    each pair's (a) and (b) run back to back (order alternating): both pay the same moment's
    machine noise, which fresh-engine rounds spread over a minute. A first, untimed pass of
    each engine takes the first-step costs out of both."""
    context = multiprocessing.get_context("spawn")
    workers = {}
    for kind in ("prefill", "extract"):
        conn, child = context.Pipe()
        process = context.Process(
            target=warm_worker, args=(kind, args.model, str(tokens), args.encode_threads, child)
        )
        process.start()
        workers[kind] = (process, conn)
    seconds: dict[str, list[float]] = {"prefill": [], "extract": []}
    for i in range(args.warm_pairs + 1):
        for kind in ("prefill", "extract") if i % 2 else ("extract", "prefill"):
            workers[kind][1].send(str(work / "shard-warm.zarr"))
            seconds[kind].append(workers[kind][1].recv())
    for process, conn in workers.values():
        conn.send(None)
        process.join()
    n_tokens = sum(len(s["input_ids"]) for s in read_jsonl(tokens))
    by_pair = [a / b for a, b in zip(seconds["prefill"][1:], seconds["extract"][1:], strict=True)]
    return {
        "warm_prefill_tok_s": median(n_tokens / s for s in seconds["prefill"][1:]),
        "warm_extract_tok_s": median(n_tokens / s for s in seconds["extract"][1:]),
        "extract_over_prefill_warm_by_pair": by_pair,
        "extract_over_prefill_warm": median(by_pair),
    }


def job_extract(args: argparse.Namespace) -> dict:
    """`extract_shard` into `--out`."""
    from eagleflow.extract import extract_shard

    return extract_shard(
        args.tokens,
        args.model,
        args.out,
        backend=args.backend,
        codec=args.codec,
        encode_threads=args.encode_threads,
    )


def job_server(args: argparse.Namespace) -> dict:
    """`extract_shard` into `--out` through an extraction server started here (its start-up,
    a one-time cost shared by all shard jobs, is not timed)."""
    import socket

    from eagleflow.extract import extract_shard
    from eagleflow.extraction_server import running_server
    from eagleflow.layers import default_layer_ids
    from eagleflow.target_config import target_num_layers

    num_layers = target_num_layers(args.model)
    aux_ids, last_id = default_layer_ids(num_layers)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    storage = Path(args.out).with_suffix(".states")
    with running_server(
        args.model, port=port, extract_layer_ids=[*aux_ids, last_id], storage_dir=storage
    ) as url:
        return extract_shard(
            args.tokens,
            args.model,
            args.out,
            backend="server",
            server_url=url,
            server_concurrency=args.server_concurrency,
        )


def naive_extract(model_dir: str, tokens: str | Path, out: str | Path, device: str = "cpu") -> dict:
    """One sample at a time through the full causal LM on `device`, `output_hidden_states=True`,
    and a `torch.save` per sample of the aux layers and the last entry (baseline (c))."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagleflow.layers import default_layer_ids
    from eagleflow.precision import compute_dtype

    samples = read_jsonl(tokens)
    # The device's fast dtype, as the hf backend uses (bf16 is emulated on AVX2-only CPUs).
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=compute_dtype(device)).eval()
    model.to(device)
    aux_ids, _ = default_layer_ids(model.config.num_hidden_layers)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with torch.inference_mode():
        for sample in samples:
            ids = torch.tensor([sample["input_ids"]], device=device)
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
            aux = torch.stack([states[k][0] for k in aux_ids], dim=1).bfloat16()
            torch.save({"aux": aux, "last": states[-1][0].bfloat16()}, out / f"{sample['id']}.pt")
    seconds = time.monotonic() - start
    n_tokens = sum(len(s["input_ids"]) for s in samples)
    stored = sum(p.stat().st_size for p in out.iterdir())
    return {"tokens": n_tokens, "seconds": seconds, "tokens_per_s": n_tokens / seconds,
            "stored_bytes": stored}  # fmt: skip


def job_naive(args: argparse.Namespace) -> dict:
    """Baseline (c) on the CPU: `naive_extract` of `--tokens` into `--out`."""
    return naive_extract(args.model, args.tokens, args.out)


def run_job(job: str, args: argparse.Namespace, work: Path, **options: str) -> dict:
    """Run one job in a subprocess; its result plus `peak_rss` (the sum over its process tree,
    sampled every 0.1 s) and `max_process_rss` (its largest single process, from wait4)."""
    result = work / f"{job}-{len(list(work.glob(job + '-*.json')))}.json"
    argv = [sys.executable, __file__, "--job", job, "--model", args.model, "--result", str(result)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    log = work / f"{result.stem}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        root, peak = psutil.Process(proc.pid), 0
        while True:
            # wait4 rather than Popen.wait: its rusage holds the job's largest process (the
            # vLLM engine processes included, once the job has reaped them).
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
            except psutil.Error:  # a process ended while being sampled
                pass
            time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"job {job} failed ({proc.returncode}); log {log}:\n{tail}")
    figures = json.loads(result.read_text())
    figures["peak_rss"] = peak
    figures["max_process_rss"] = usage.ru_maxrss * 1024
    return figures


def over_rounds(results: list[dict]) -> dict:
    """One job's figures over the rounds: tokens/s the median, memory the largest, the rest
    (tokens, bytes: the same in every round) from the first."""
    figures = {**results[0], "tokens_per_s": median(r["tokens_per_s"] for r in results)}
    for key in ("peak_rss", "max_process_rss"):
        if key in figures:
            figures[key] = max(r[key] for r in results)
    return figures


def build_samples(args: argparse.Namespace, work: Path) -> list[dict]:
    if args.samples:
        return samples_from_records(read_jsonl(args.samples)[: args.n])
    responses = work / "responses.jsonl"
    run_job("generate", args, work, prompts=args.prompts, n=args.n,
            max_new_tokens=args.max_new_tokens, out=responses)  # fmt: skip
    return samples_from_records(read_jsonl(responses))


def table_rows(f: dict) -> list[Row]:
    rss_growth = f["peak_rss_4x"] / f["peak_rss_1x"]
    process_growth = f["max_process_rss_4x"] / f["max_process_rss_1x"]
    flat = f"flat: 4x <= {GOAL_RSS_GROWTH:g} x 1x"

    def b_over_a(figure: str, key: str) -> Row:
        return goal_row(figure, f[key], GOAL_EXTRACT_OVER_PREFILL, key)

    return [
        Row("rounds of (a) and (b) (their figures below: medians)", f"{f['rounds']}", key="rounds"),
        Row("(a) bare vLLM prefill, tok/s", f"{f['prefill_tok_s']:,.0f}", key="prefill_tok_s"),
        Row("(b) vLLM extraction to zarr, tok/s", f"{f['extract_tok_s']:,.0f}",
            key="extract_tok_s"),
        Row("(c) naive HF loop + torch.save, tok/s", f"{f['naive_tok_s']:,.0f}", key="naive_tok_s"),
        Row("(d) extraction through one vLLM server, tok/s", f"{f['server_tok_s']:,.0f}",
            key="server_tok_s"),
        Row("(a) / (b) at 4x, tok/s",
            f"{f['prefill_4x_tok_s']:,.0f} / {f['extract_4x_tok_s']:,.0f}",
            key="prefill_4x_tok_s, extract_4x_tok_s"),
        b_over_a("b / a, 1x shard", "extract_over_prefill"),
        b_over_a("b / a, 4x shard", "extract_over_prefill_4x"),
        Row("b / a by round, 1x; 4x",
            f"{joined(f['extract_over_prefill_by_round'])}; "
            f"{joined(f['extract_over_prefill_4x_by_round'])}",
            key="extract_over_prefill_by_round"),
        Row(f"warm engines, {f['warm_pairs']} pairs of passes back to back: (a) / (b) tok/s",
            f"{f['warm_prefill_tok_s']:,.0f} / {f['warm_extract_tok_s']:,.0f}",
            key="warm_prefill_tok_s, warm_extract_tok_s"),
        b_over_a("b / a, warm engines (median of the pairs)", "extract_over_prefill_warm"),
        Row("b / a by pair, warm engines", joined(f["extract_over_prefill_warm_by_pair"]),
            key="extract_over_prefill_warm_by_pair"),
        Row(f"(b1) as (b) with chunks encoded on the engine's thread instead of "
            f"{f['encode_threads']} encode threads: tok/s, b1 / a",
            f"{f['extract_serial_tok_s']:,.0f}, {f['serial_over_prefill']:.2f}",
            key="extract_serial_tok_s, serial_over_prefill"),
        Row("(b0) as (b) without compression: tok/s, b0 / a",
            f"{f['uncompressed_tok_s']:,.0f}, {f['uncompressed_over_prefill']:.2f}",
            key="uncompressed_tok_s, uncompressed_over_prefill"),
        Row("us/token: prefill (a); extraction beyond it; of which compression",
            f"{f['prefill_us_per_token']:.1f}; {f['extraction_us_per_token']:.1f}; "
            f"{f['compression_us_per_token']:.1f}",
            key="prefill_us_per_token, extraction_us_per_token, compression_us_per_token"),
        goal_row("b / c", f["extract_over_naive"], GOAL_EXTRACT_OVER_NAIVE, "extract_over_naive"),
        Row("d / b (server mode vs in-process)", f"{f['server_over_extract']:.2f}",
            key="server_over_extract"),
        Row("activation bytes/token: stored / raw bf16",
            f"{f['stored_bytes_per_token']:.0f} / {f['raw_bytes_per_token']:.0f} = "
            f"{f['stored_over_raw']:.3f}",
            f"<= {GOAL_STORED_OVER_RAW:g}", f["stored_over_raw"] <= GOAL_STORED_OVER_RAW,
            "stored_over_raw"),
        Row("naive torch.save bytes/token", f"{f['naive_bytes_per_token']:.0f}",
            key="naive_bytes_per_token"),
        Row("peak RSS of an extraction job (process tree), 1x / 4x shard",
            f"{f['peak_rss_1x'] / MIB:,.0f} / {f['peak_rss_4x'] / MIB:,.0f} MiB "
            f"(x{rss_growth:.2f})",
            flat, rss_growth <= GOAL_RSS_GROWTH, "peak_rss_1x, peak_rss_4x"),
        Row("largest process of the extraction job, 1x / 4x shard",
            f"{f['max_process_rss_1x'] / MIB:,.0f} / {f['max_process_rss_4x'] / MIB:,.0f} MiB "
            f"(x{process_growth:.2f})",
            flat, process_growth <= GOAL_RSS_GROWTH, "max_process_rss_1x, max_process_rss_4x"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="results/demo/target")
    parser.add_argument("--prompts", default="results/prompts/prompts.jsonl")
    parser.add_argument("--samples", help="responses or tokens JSONL (instead of --prompts)")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--workdir", type=Path, help="keep the shards and logs here")
    output_arguments(parser, "extraction")
    # Internal: run one job (in a subprocess of the bench).
    parser.add_argument("--job", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="vllm", help=argparse.SUPPRESS)
    parser.add_argument("--codec", default=DEFAULT_CODEC, help=argparse.SUPPRESS)
    parser.add_argument("--server-concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (a) and (b), medians")
    parser.add_argument(
        "--warm-pairs", type=int, default=10, help="pairs of (a) and (b) passes of warm engines"
    )
    parser.add_argument(
        "--encode-threads", type=int, default=2, help="chunk encode threads (the rule's threads)"
    )
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"

    if args.job:
        job = {"generate": job_generate, "prefill": job_prefill, "extract": job_extract,
               "naive": job_naive, "server": job_server}[args.job]  # fmt: skip
        args.result.write_text(json.dumps(job(args)) + "\n")
        return

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-extraction-"))
    work.mkdir(parents=True, exist_ok=True)
    samples = build_samples(args, work)
    tokens_1x, tokens_4x = work / "tokens-1x.jsonl", work / "tokens-4x.jsonl"
    write_jsonl(tokens_1x, samples)
    write_jsonl(tokens_4x, [{**s, "id": f"{s['id']}/{k}"} for k in range(4) for s in samples])
    n_tokens = sum(len(s["input_ids"]) for s in samples)
    print(f"{len(samples)} samples, {n_tokens} tokens ({n_tokens / len(samples):.0f} per sample)")

    warm = warm_pairs(args, tokens_1x, work)
    # (a) and (b) in rounds, their order alternating, so that drift on a shared machine does not
    # land on one side of the ratio; medians are reported with each round's ratio.
    rounds = []
    for r in range(args.rounds):
        # Each in a fresh engine, as a shard job extracts: a warm engine's second pass skips
        # the first-step costs (kernel primitives created per new shape) that a cold one pays.
        jobs = {
            "prefill_1x": lambda: run_job("prefill", args, work, tokens=tokens_1x),
            "extract_1x": lambda r=r: run_job(
                "extract", args, work, tokens=tokens_1x, out=work / f"shard-1x-{r}.zarr"
            ),
            "prefill_4x": lambda: run_job("prefill", args, work, tokens=tokens_4x),
            "extract_4x": lambda r=r: run_job(
                "extract", args, work, tokens=tokens_4x, out=work / f"shard-4x-{r}.zarr"
            ),
        }
        rounds.append({name: jobs[name]() for name in (reversed(jobs) if r % 2 else jobs)})
    prefill_1x, prefill_4x, extract_1x, extract_4x = (
        over_rounds([r[name] for r in rounds])
        for name in ("prefill_1x", "prefill_4x", "extract_1x", "extract_4x")
    )
    by_round = {
        f"extract_over_prefill{suffix}_by_round": [
            r[f"extract_{size}"]["tokens_per_s"] / r[f"prefill_{size}"]["tokens_per_s"]
            for r in rounds
        ]
        for size, suffix in (("1x", ""), ("4x", "_4x"))
    }
    uncompressed = run_job("extract", args, work, tokens=tokens_1x, out=work / "shard-none.zarr",
                           codec="none")  # fmt: skip
    serial = run_job("extract", args, work, tokens=tokens_1x, out=work / "shard-serial.zarr",
                     encode_threads=0)  # fmt: skip
    naive = run_job("naive", args, work, tokens=tokens_1x, out=work / "naive")
    server = run_job("server", args, work, tokens=tokens_1x, out=work / "shard-server.zarr",
                     server_concurrency=args.server_concurrency)  # fmt: skip

    raw_per_token = extract_1x["activation_raw_bytes"] / extract_1x["tokens"]
    stored_per_token = extract_1x["activation_stored_bytes"] / extract_1x["tokens"]
    figures = {
        "samples": len(samples),
        "tokens": n_tokens,
        "prefill_tok_s": prefill_1x["tokens_per_s"],
        "prefill_4x_tok_s": prefill_4x["tokens_per_s"],
        "extract_tok_s": extract_1x["tokens_per_s"],
        "extract_4x_tok_s": extract_4x["tokens_per_s"],
        "encode_threads": args.encode_threads,
        "extract_serial_tok_s": serial["tokens_per_s"],
        "serial_over_prefill": serial["tokens_per_s"] / prefill_1x["tokens_per_s"],
        "naive_tok_s": naive["tokens_per_s"],
        "server_tok_s": server["tokens_per_s"],
        "server_over_extract": server["tokens_per_s"] / extract_1x["tokens_per_s"],
        "rounds": args.rounds,
        **by_round,
        "extract_over_prefill": median(by_round["extract_over_prefill_by_round"]),
        "uncompressed_tok_s": uncompressed["tokens_per_s"],
        "uncompressed_over_prefill": uncompressed["tokens_per_s"] / prefill_1x["tokens_per_s"],
        # Microseconds per token: the compression (b vs b without it) and all of the extraction
        # pipeline (b vs a), on the same cores as the prefill.
        "compression_us_per_token": 1e6 / extract_1x["tokens_per_s"]
        - 1e6 / uncompressed["tokens_per_s"],
        "extraction_us_per_token": 1e6 / extract_1x["tokens_per_s"]
        - 1e6 / prefill_1x["tokens_per_s"],
        "prefill_us_per_token": 1e6 / prefill_1x["tokens_per_s"],
        "extract_over_prefill_4x": median(by_round["extract_over_prefill_4x_by_round"]),
        "warm_pairs": args.warm_pairs,
        **warm,
        "extract_over_naive": extract_1x["tokens_per_s"] / naive["tokens_per_s"],
        "raw_bytes_per_token": raw_per_token,
        "stored_bytes_per_token": stored_per_token,
        "stored_over_raw": stored_per_token / raw_per_token,
        "naive_bytes_per_token": naive["stored_bytes"] / naive["tokens"],
        "peak_rss_1x": extract_1x["peak_rss"],
        "peak_rss_4x": extract_4x["peak_rss"],
        "max_process_rss_1x": extract_1x["max_process_rss"],
        "max_process_rss_4x": extract_4x["max_process_rss"],
        "extract_1x": extract_1x,
        "extract_4x": extract_4x,
    }
    print(f"\nshards, logs: {work}")
    finish(args, "Extraction", table_rows(figures), figures)


if __name__ == "__main__":
    main()
