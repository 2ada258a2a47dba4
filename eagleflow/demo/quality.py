"""Measure whether a target model's greedy answers are varied and well formed.

A drafter trained on a model that loops on one phrase, or never closes its think block,
would show acceptance figures that mean nothing; these two numbers catch both.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

MIN_DISTINCT_4 = 0.3
MIN_THINK_WELLFORMED = 0.8
MAX_NEW_TOKENS = 256
HF_BATCH_SIZE = 32

THINK_BLOCK = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)


def distinct_ngram_ratio(sequences: list[list[int]], n: int = 4) -> float:
    """Distinct n-grams over all n-grams, pooled across sequences (0 when there are none)."""
    ngrams = [tuple(seq[i : i + n]) for seq in sequences for i in range(len(seq) - n + 1)]
    return len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def split_think(text: str) -> tuple[str, str] | None:
    """(reasoning, answer) when the text is one `<think>…</think>` block then an answer."""
    match = THINK_BLOCK.fullmatch(text)
    if match is None or "<think>" in match.group(2) or "</think>" in match.group(2):
        return None
    reasoning, answer = match.group(1).strip(), match.group(2).strip()
    if "<think>" in reasoning or not reasoning or not answer:
        return None
    return reasoning, answer


def answer_matches(text: str, expected: str) -> bool:
    """Whether the answer after the think block contains `expected` as a whole item."""
    parts = split_think(text)
    if parts is None:
        return False
    return re.search(rf"(?<!\w){re.escape(expected)}(?!\w)", parts[1]) is not None


def _generate_vllm(model_dir: Path, conversations: list[list[dict]]) -> list[tuple[list[int], str]]:
    from vllm import SamplingParams

    from eagleflow.engine import build_llm

    llm = build_llm(model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    outputs = llm.chat(conversations, params, use_tqdm=False)
    eos_id = llm.get_tokenizer().eos_token_id
    results = []
    for output in outputs:
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        # vLLM keeps the stop token in token_ids; HF's path drops it, so drop it here too.
        if token_ids and token_ids[-1] == eos_id:
            token_ids.pop()
        results.append((token_ids, completion.text))
    return results


def _generate_hf(model_dir: Path, conversations: list[list[dict]]) -> list[tuple[list[int], str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    results = []
    for start in range(0, len(conversations), HF_BATCH_SIZE):
        batch = conversations[start : start + HF_BATCH_SIZE]
        texts = [
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
            for m in batch
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            generated = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        for row in generated[:, inputs["input_ids"].shape[1] :].tolist():
            # Cut at the first end-of-turn; the padding that follows it is not part of the answer.
            token_ids = (
                row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
            )
            results.append((token_ids, tokenizer.decode(token_ids, skip_special_tokens=True)))
    return results


def _first_records(prompts_path: Path, n: int) -> list[dict]:
    records = []
    with open(prompts_path) as lines:
        for line in lines:
            if len(records) == n:
                break
            if line.strip():
                records.append(json.loads(line))
    return records


def measure_answer_quality(
    model_dir: str | Path, prompts_path: str | Path, n: int = 200, backend: str = "vllm"
) -> dict:
    """Greedy answers for the first `n` prompts of a JSONL of `{"messages": [...]}` records.

    Returns `n`, `distinct_4` (pooled over generated token ids), `think_wellformed` and, when
    the records carry an `"answer"`, `answer_correct`.
    """
    generators = {"vllm": _generate_vllm, "hf": _generate_hf}
    if backend not in generators:
        raise ValueError(f"backend must be one of {sorted(generators)}, not {backend!r}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    records = _first_records(Path(prompts_path), n)
    outputs = generators[backend](Path(model_dir), [record["messages"] for record in records])
    texts = [text for _, text in outputs]
    result = {
        "n": len(records),
        "distinct_4": distinct_ngram_ratio([token_ids for token_ids, _ in outputs]),
        "think_wellformed": sum(split_think(text) is not None for text in texts) / len(texts),
    }
    if all("answer" in record for record in records):
        correct = sum(
            answer_matches(text, record["answer"])
            for text, record in zip(texts, records, strict=True)
        )
        result["answer_correct"] = correct / len(records)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("prompts", type=Path, help="JSONL of {'messages': [...]} records")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    args = parser.parse_args(argv)
    result = measure_answer_quality(args.model_dir, args.prompts, args.n, args.backend)
    print(json.dumps(result))
    passed = (
        result["distinct_4"] >= MIN_DISTINCT_4
        and result["think_wellformed"] >= MIN_THINK_WELLFORMED
    )
    if not passed:
        print(
            f"below target: distinct_4 >= {MIN_DISTINCT_4} and think_wellformed >= "
            f"{MIN_THINK_WELLFORMED} required",
            file=sys.stderr,
        )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
