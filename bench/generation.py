"""Generation side by side on the same prompts, in one run: vLLM in-process, vLLM server, HF.

Prints tokens/s of each backend, the server/in-process ratio, and the fraction of prompts whose
greedy token ids are identical between backends (with the position of the first difference).
On a CPU it also builds the in-process engine both ways vLLM can lay it out: its core in this
process (`build_llm`'s CPU default) and in a process of its own (vLLM's default), with the
seconds each takes to start and its tokens/s.

    .venv/bin/python bench/generation.py --model results/demo/target \
        --prompts results/prompts/prompts.jsonl --n 300
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from rows import Row, finish, output_arguments
from transformers import AutoTokenizer

from eagleflow.chat import render_prompt_ids
from eagleflow.engine import build_llm
from eagleflow.extraction_server import running_server
from eagleflow.files import read_jsonl
from eagleflow.generate import Completion, Sampling, generate_hf, generate_server


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name: str, reference: list, other: list) -> dict:
    diffs = [
        first_difference(r.token_ids, o.token_ids) for r, o in zip(reference, other, strict=True)
    ]
    differing = [d for d in diffs if d is not None]
    identical = len(diffs) - len(differing)
    return {
        "pair": name,
        "identical": identical,
        "of": len(diffs),
        "fraction": round(identical / len(diffs), 4),
        "median_first_difference": sorted(differing)[len(differing) // 2] if differing else None,
    }


BACKENDS = {
    "vllm": "vLLM in-process",
    "server": "vLLM server",
    "hf": "HF",
    "vllm_own_core": "vLLM in-process, core in its own process",
}


def engine_layout(
    model: str, prompt_ids: list, max_new_tokens: int, in_process: bool | None
) -> dict:
    """Start an engine with its core laid out one way (None: `build_llm`'s default), generate
    greedily: seconds to start, seconds to generate, token ids."""
    from vllm import SamplingParams, TokensPrompt

    start = time.monotonic()
    llm = build_llm(model, in_process_core=in_process)
    started = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
    done = time.monotonic()
    del llm
    gc.collect()
    ids = [list(out.outputs[0].token_ids) for out in outputs]
    return {"start_s": round(started - start, 1), "seconds": done - started, "ids": ids}


def table_rows(f: dict) -> list[Row]:
    rows = [
        Row(
            f"{BACKENDS[name]}, tok/s ({f['prompts']} prompts, greedy)",
            f"{b['tokens_per_s']:,.0f}",
            key=f"backends.{name}.tokens_per_s",
        )
        for name, b in f["backends"].items()
    ]
    rows.append(
        Row("server / in-process tok/s", f"{f['server_over_inprocess']:.2f}",
            key="server_over_inprocess")
    )  # fmt: skip
    rows += [
        Row(
            f"{a['pair']}: identical greedy token ids",
            f"{a['identical']}/{a['of']} ({a['fraction']:.1%})",
            key="agreement",
        )
        for a in f["agreement"]
    ]
    rows += [
        Row(f"{BACKENDS[name]}, engine start (s)", f"{start:.1f}", key=f"start_s.{name}")
        for name, start in f["start_s"].items()
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="results/demo/target")
    parser.add_argument("--prompts", default="results/prompts/prompts.jsonl")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--port", type=int, default=18731)
    parser.add_argument("--skip-hf", action="store_true")
    output_arguments(parser, "generation")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = read_jsonl(args.prompts)[: args.n]
    prompt_ids = [render_prompt_ids(tokenizer, p["messages"]) for p in prompts]
    seeds = [0] * len(prompt_ids)
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    runs: dict[str, tuple[list, float]] = {}

    def timed(name: str, fn) -> None:
        start = time.monotonic()
        completions = fn()
        seconds = time.monotonic() - start
        runs[name] = (completions, seconds)

    # In-process: generation time only (engine start apart), as for the already-started server.
    layouts = {"vllm": None}
    import vllm  # noqa: F401  (imported here, so that no engine's start-up counts the import)
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # the layout vLLM takes by default, for comparison
        layouts["vllm_own_core"] = False
    start_s = {}
    for name, in_process in layouts.items():
        run = engine_layout(args.model, prompt_ids, args.max_new_tokens, in_process)
        runs[name] = ([Completion(ids, "") for ids in run["ids"]], run["seconds"])
        start_s[name] = run["start_s"]
    with running_server(args.model, port=args.port) as url:
        timed("server", lambda: generate_server(url, prompt_ids, seeds, greedy, concurrency=32))
    if not args.skip_hf:
        timed("hf", lambda: generate_hf(args.model, prompt_ids, seeds, greedy))

    figures = {"prompts": len(prompt_ids), "backends": {}, "agreement": [], "start_s": start_s}
    print(f"\n{len(prompt_ids)} prompts, greedy, max_new_tokens={args.max_new_tokens}")
    for name, (completions, seconds) in runs.items():
        tokens = sum(len(c.token_ids) for c in completions)
        figures["backends"][name] = {"tokens": tokens, "seconds": round(seconds, 2),
                                     "tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip
    rate = {k: v["tokens_per_s"] for k, v in figures["backends"].items()}
    figures["server_over_inprocess"] = round(rate["server"] / rate["vllm"], 3)
    reference = runs["vllm"][0]
    for other in [k for k in runs if k != "vllm"]:
        agreement = compare(f"vllm vs {other}", reference, runs[other][0])
        figures["agreement"].append(agreement)
        print(
            f"{agreement['pair']}: identical token ids for {agreement['identical']}/"
            f"{agreement['of']} prompts ({agreement['fraction']:.1%}); median first differing "
            f"position among the rest: {agreement['median_first_difference']}"
        )
    finish(args, "Generation", table_rows(figures), figures)


if __name__ == "__main__":
    main()
