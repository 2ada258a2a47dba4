"""The extract stage's `hf` backend: transformers, with forward hooks on the chosen decoder layers
of the base model (the `lm_head` is never computed), in length-sorted padded batches.

It writes the same shards as the vLLM backends (`eagleflow.extract`), and is their reference:
tests compare both with HF's own `output_hidden_states`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from eagleflow.hf_target import load_causal_lm
from eagleflow.logs import InputError
from eagleflow.precision import compute_dtype
from eagleflow.progress import token_progress
from eagleflow.shards import ShardWriter
from eagleflow.vllm_capture import captured_ids


def _windows(samples: Sequence[dict], window_tokens: int) -> Iterator[list[int]]:
    """Consecutive runs of sample indices holding about `window_tokens` tokens each."""
    window: list[int] = []
    tokens = 0
    for i, sample in enumerate(samples):
        window.append(i)
        tokens += len(sample["input_ids"])
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def _length_batches(
    samples: Sequence[dict], indices: list[int], batch_tokens: int
) -> Iterator[list[int]]:
    """`indices` sorted by length (longest first), cut into batches of at most `batch_tokens`
    padded tokens (a single longer sample makes a batch of its own)."""
    order = sorted(indices, key=lambda i: -len(samples[i]["input_ids"]))
    batch: list[int] = []
    for i in order:
        width = len(samples[batch[0]]["input_ids"]) if batch else len(samples[i]["input_ids"])
        if batch and (len(batch) + 1) * width > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _padded(samples: Sequence[dict], batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask of the samples `batch`."""
    width = max(len(samples[i]["input_ids"]) for i in batch)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, i in enumerate(batch):
        n = len(samples[i]["input_ids"])
        input_ids[row, :n] = torch.from_numpy(samples[i]["input_ids"])
        attention[row, :n] = 1
    return input_ids, attention


def extract_hf(
    model_dir: str | Path,
    samples: Sequence[dict],
    writer: ShardWriter,
    *,
    batch_tokens: int = 8192,
    window_tokens: int = 65536,
    trust_remote_code: bool = False,
) -> float:
    """Append every sample's hidden states, computed by transformers in bf16, to `writer`;
    return the seconds spent extracting (model loading excluded).

    Forward hooks on the decoder layers of the captured ids (the writer's `aux_layer_ids` and
    `last_layer_id`, which must be N) take their outputs; the `lm_head` is never run. Samples
    are taken in windows of about `window_tokens` consecutive tokens, sorted by length within a
    window and run in right-padded batches of at most `batch_tokens` padded tokens, so memory
    stays bounded by the window while samples are still appended in order.
    """
    # Only the base model runs (the lm_head is loaded, but never computed); on the GPU when
    # there is one, so the same code serves both.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # bf16 where the device computes it natively; elsewhere float32, rounded to bf16 when stored.
    dtype = compute_dtype(device)
    # The text decoder alone (of a wrapper too); its hooked layers give the states.
    model = load_causal_lm(
        model_dir, dtype=dtype, trust_remote_code=trust_remote_code
    ).get_decoder()
    model.to(device).eval()
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise InputError(f"{model_dir}: cannot find the decoder layers of {type(model).__name__}")
    ids = captured_ids(writer, len(layers))
    captured: dict[int, torch.Tensor] = {}

    def keep(layer_id: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    # Layer id k is the output of decoder layer k-1 (the residual stream after k layers).
    handles = [layers[i - 1].register_forward_hook(keep(i)) for i in ids]
    start = time.monotonic()
    try:
        total = sum(len(s["input_ids"]) for s in samples)
        # Tokens, not samples: lengths vary widely, and longest-first batches skew a count.
        with token_progress(total, "extract (hf)", unit="tok") as progress, torch.inference_mode():
            for window in _windows(samples, window_tokens):
                results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
                for batch in _length_batches(samples, window, batch_tokens):
                    input_ids, attention = _padded(samples, batch)
                    model(
                        input_ids=input_ids.to(device),
                        attention_mask=attention.to(device),
                        use_cache=False,
                    )
                    aux = torch.stack([captured[i] for i in writer.aux_layer_ids], dim=2)
                    aux = aux.to("cpu", torch.bfloat16)
                    last = captured[writer.last_layer_id].to("cpu", torch.bfloat16)
                    captured.clear()
                    for row, i in enumerate(batch):
                        n = len(samples[i]["input_ids"])
                        results[i] = (aux[row, :n].clone(), last[row, :n].clone())
                    progress.advance(int(attention.sum()), int(attention.sum()))
                for i in window:
                    aux, last = results.pop(i)
                    sample = samples[i]
                    writer.append(sample["id"], sample["input_ids"], sample["loss_mask"], aux, last)
    finally:
        for handle in handles:
            handle.remove()
    return time.monotonic() - start
