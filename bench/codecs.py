"""Codec comparison for hidden-state shards, on real activations, through the real ShardWriter.

For every codec of `eagleflow.shards.CODECS`: compression ratio of the activation arrays (raw
aux + last bytes / stored bytes), write MB/s and read MB/s (raw MB per second of wall time, a
whole shard written with ShardWriter, then read back with Shard.iter_samples), and the ratio
once rows repeated across samples (shared prompt prefixes) are removed. Prints a markdown table.

Activations come from an HF Llama directory: each prompt is rendered with the chat template,
answered greedily (`--max-new-tokens`, as the workflow stores prompt + response) and run once
more with `output_hidden_states=True`; layers (2, N//2, N-3) are kept, and layer N is taken
before the final norm by a hook on the last decoder layer. Without a model directory the bench
falls back to synthetic heavy-tailed bf16 data, and says so.

    .venv/bin/python bench/codecs.py --model results/demo/target \
        --prompts results/prompts/prompts.jsonl --n 300
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rows import Row, finish, output_arguments

from eagleflow.files import read_jsonl
from eagleflow.shards import (
    CODECS,
    DEFAULT_CODEC,
    ShardWriter,
    bf16_to_uint16,
    open_shard,
)

# The default codec's compression ratio, on real activations: stored / raw <= 0.77.
GOAL_RATIO = 1 / 0.77
Sample = dict  # sample_id, input_ids, loss_mask, aux (uint16 [T, A, H]), last (uint16 [T, H])


def load_conversations(prompts: Path, n: int) -> tuple[list[list[dict]], str]:
    """`n` message lists from a JSONL file, or the demo prompts when the file is absent."""
    if prompts.is_file():
        return [r["messages"] for r in read_jsonl(prompts)[:n]], str(prompts)
    from eagleflow.demo.corpus import demo_prompts

    return [r["messages"] for r in demo_prompts(seed=1, n=n)], "demo prompts (seed 1)"


@torch.inference_mode()
def capture(model_dir: Path, conversations: list[list[dict]], max_new_tokens: int) -> dict:
    """Real activations: samples plus a description of where they came from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    n_layers = model.config.num_hidden_layers
    aux_ids = [2, n_layers // 2, n_layers - 3]

    sequences = []
    for messages in conversations:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=messages[-1]["role"] != "assistant"
        )
        sequences.append(tokenizer.encode(text, add_special_tokens=False))
    if max_new_tokens:
        sequences = generate(model, tokenizer, sequences, max_new_tokens)

    pre_norm = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda _module, _inputs, output: pre_norm.append(
            output[0] if isinstance(output, tuple) else output
        )
    )
    samples = []
    try:
        for i, ids in enumerate(sequences):
            pre_norm.clear()
            out = model(torch.tensor([ids]), output_hidden_states=True)
            last = pre_norm[0][0]
            # HF's last hidden state is after the final norm; the stored one must be before it.
            normed = model.model.norm(last)
            assert torch.allclose(normed.float(), out.hidden_states[-1][0].float(), atol=1e-2)
            aux = torch.stack([out.hidden_states[k][0] for k in aux_ids], dim=1)
            samples.append(
                {
                    "sample_id": f"sample-{i:05d}",
                    "input_ids": np.asarray(ids, dtype=np.int32),
                    "loss_mask": np.ones(len(ids), dtype=bool),
                    "aux": bf16_to_uint16(aux),
                    "last": bf16_to_uint16(last),
                }
            )
    finally:
        hook.remove()
    source = (
        f"{model_dir} (N={n_layers}, H={model.config.hidden_size}), aux ids {aux_ids} + {n_layers}"
        f" pre-norm, prompts + greedy responses of up to {max_new_tokens} tokens"
    )
    return {
        "samples": samples,
        "aux_ids": aux_ids,
        "last_id": n_layers,
        "hidden": model.config.hidden_size,
        "source": source,
    }


def generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Prompt + greedy response ids (through the first end-of-sequence token), batched."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), 32):
        batch = [prompts[i] for i in order[start : start + 32]]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for i, prompt, row in zip(order[start : start + 32], batch, out, strict=True):
            response = []
            for token in row[width:].tolist():
                response.append(token)
                if token in eos:
                    break
            results[i] = prompt + response
    return results


def synthetic(n: int, hidden: int = 1024, seed: int = 0) -> dict:
    """Heavy-tailed stand-in: Student-t values, a few massive channels, varying token scale."""
    rng = np.random.default_rng(seed)
    massive = rng.choice(hidden, size=4, replace=False)
    samples = []
    for i in range(n):
        t = int(rng.integers(64, 512))
        x = rng.standard_t(df=3, size=(t, 4, hidden)).astype(np.float32)
        x *= rng.lognormal(0.0, 0.5, size=(t, 1, 1)).astype(np.float32)
        x[:, :, massive] *= 300.0
        bits = bf16_to_uint16(torch.from_numpy(x).bfloat16())
        samples.append(
            {
                "sample_id": f"sample-{i:05d}",
                "input_ids": rng.integers(0, 32000, size=t).astype(np.int32),
                "loss_mask": np.ones(t, dtype=bool),
                "aux": np.ascontiguousarray(bits[:, :3]),
                "last": np.ascontiguousarray(bits[:, 3]),
            }
        )
    return {
        "samples": samples,
        "aux_ids": [2, 16, 29],
        "last_id": 32,
        "hidden": hidden,
        "source": f"SYNTHETIC heavy-tailed bf16 (Student-t df=3, H={hidden}): no model given",
    }


def without_repeated_rows(samples: list[Sample]) -> list[Sample]:
    """The samples with every token row (aux + last) seen before dropped."""
    seen: set[bytes] = set()
    unique = []
    for sample in samples:
        keep = []
        for t in range(len(sample["input_ids"])):
            key = sample["aux"][t].tobytes() + sample["last"][t].tobytes()
            keep.append(key not in seen)
            seen.add(key)
        if any(keep):
            unique.append({k: v if k == "sample_id" else v[keep] for k, v in sample.items()})
    return unique


def measure(data: dict, samples: list[Sample], codec: str, chunk_bytes: int, root: Path) -> dict:
    """Write and read one shard with `codec`; ratio and speeds of the activation arrays."""
    path = root / f"{codec}.zarr"
    started = time.perf_counter()
    with ShardWriter(
        path,
        aux_layer_ids=data["aux_ids"],
        last_layer_id=data["last_id"],
        hidden_size=data["hidden"],
        attrs={"backend": "bench"},
        codec=codec,
        chunk_bytes=chunk_bytes,
    ) as writer:
        for sample in samples:
            writer.append(**sample)
    write_s = time.perf_counter() - started

    shard = open_shard(path)
    started = time.perf_counter()
    for _sample in shard.iter_samples():  # bf16 tensors, as a loader gets them
        pass
    read_s = time.perf_counter() - started
    raw = shard.nbytes_raw(("aux", "last"))
    stored = shard.nbytes_stored(("aux", "last"))
    shutil.rmtree(path)
    return {"raw": raw, "stored": stored, "write_s": write_s, "read_s": read_s}


def best_of(repeats: int, *args) -> dict:
    runs = [measure(*args) for _ in range(repeats)]
    return {
        **runs[0],
        "write_s": min(r["write_s"] for r in runs),
        "read_s": min(r["read_s"] for r in runs),
    }


def table_rows(f: dict) -> list[Row]:
    rows = [
        Row("data", f"{f['samples']} samples, {f['tokens']:,} tokens: {f['source']}", key="source")
    ]
    for name, c in f["codecs"].items():
        default = name == f["default_codec"]
        goal = default and not f["synthetic"]
        rows.append(
            Row(
                f"{name}{' (default)' if default else ''}: ratio (repeated rows removed), "
                "write / read MB/s",
                f"{c['ratio']:.3f} ({c['ratio_repeated_rows_removed']:.3f}), "
                f"{c['write_mb_s']:,.0f} / {c['read_mb_s']:,.0f}",
                f"ratio >= {GOAL_RATIO:.2f} (stored/raw <= {1 / GOAL_RATIO:.2f})" if goal else "",
                c["ratio"] >= GOAL_RATIO if goal else None,
                f"codecs.{name}",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("results/demo/target"))
    parser.add_argument("--prompts", type=Path, default=Path("results/prompts/prompts.jsonl"))
    parser.add_argument("--n", type=int, default=300, help="samples")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--codecs", nargs="*", default=sorted(CODECS))
    parser.add_argument("--chunk-mib", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2, help="speeds are the best of these")
    parser.add_argument("--threads", type=int, default=2)
    output_arguments(parser, "codecs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    if (args.model / "config.json").is_file():
        conversations, prompt_source = load_conversations(args.prompts, args.n)
        data = capture(args.model, conversations, args.max_new_tokens)
        data["source"] += f"; {len(conversations)} conversations from {prompt_source}"
    else:
        data = synthetic(args.n)
    samples = data["samples"]
    deduplicated = without_repeated_rows(samples)
    tokens = sum(len(s["input_ids"]) for s in samples)
    unique_tokens = sum(len(s["input_ids"]) for s in deduplicated)
    chunk_bytes = int(args.chunk_mib * 2**20)
    print(f"data: {data['source']}")
    print(
        f"{len(samples)} samples, {tokens} tokens ({unique_tokens} distinct rows), "
        f"{tokens * 4 * data['hidden'] * 2 / 1e6:.1f} MB of aux + last; "
        f"captured in {time.perf_counter() - started:.0f} s; chunks of {args.chunk_mib} MiB; "
        f"{args.threads} threads; speeds best of {args.repeats}, read from the page cache\n"
    )

    figures = {
        "source": data["source"],
        "synthetic": data["source"].startswith("SYNTHETIC"),
        "samples": len(samples),
        "tokens": tokens,
        "distinct_rows": unique_tokens,
        "default_codec": DEFAULT_CODEC,
        "codecs": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-codecs-") as tmp:
        for codec in args.codecs:
            full = best_of(args.repeats, data, samples, codec, chunk_bytes, Path(tmp))
            dedup = measure(data, deduplicated, codec, chunk_bytes, Path(tmp))
            figures["codecs"][codec] = {
                "ratio": full["raw"] / full["stored"],
                "ratio_repeated_rows_removed": dedup["raw"] / dedup["stored"],
                "write_mb_s": full["raw"] / full["write_s"] / 1e6,
                "read_mb_s": full["raw"] / full["read_s"] / 1e6,
            }
    finish(args, "Codecs", table_rows(figures), figures)


if __name__ == "__main__":
    main()
