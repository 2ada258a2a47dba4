"""The KV connector that hands hidden states from vLLM's `extract_hidden_states` method to us.

vLLM's `ExampleHiddenStatesConnector` copies each finished request's hidden states out of the
cache-only KV cache and writes them, with the prompt's token ids, to one safetensors file per
request under `shared_storage_path`; a `.lock` file next to it is held until the write is done,
so a reader can wait for it (`load_hidden_states`). Its copy path needs CUDA (pinned memory, a
copy stream, events), so on CPU it fails in `_submit_async_write`. This subclass copies and
writes directly when the cache is on the CPU and keeps the stock asynchronous path on CUDA.
States are always handed over as bf16: an engine computing in float32 (a CPU without native
bf16, see `eagleflow.precision`) has them rounded here, as torch rounds float32 to bf16.

Load it with `kv_transfer_config={"kv_connector": "EagleflowHiddenStatesConnector",
"kv_connector_module_path": "eagleflow.connector", "kv_role": "kv_producer",
"kv_connector_extra_config": {"shared_storage_path": DIR}}`.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
)


class _Written:
    """Stands in for the CUDA event `get_finished` polls: on the CPU the copy and the write are
    complete before the request is reported."""

    def query(self) -> bool:
        return True


_WRITTEN = _Written()


# Hidden states handed over in memory, by the path a file would have had: filled by the
# connector, emptied by the extraction loop, when both run in one process (extra config
# `in_memory`: the in-process engine on CPU). Saves a file write, a read and two unlinks per
# request, which dominated for short samples.
CAPTURED: dict[str, dict[str, torch.Tensor]] = {}


class EagleflowHiddenStatesConnector(ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` that also works when the KV cache lives on the CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_states: dict[str, torch.Tensor] = {}  # per get_finished, emptied as saved

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        self._step_states = self._copy_finished_on_cpu()
        return super().get_finished(finished_req_ids)

    def _copy_finished_on_cpu(self) -> dict[str, torch.Tensor]:
        """The bf16 states [tokens, layers, hidden] of every request that finished this step,
        by request id, copied out of a CPU cache (whose blocks are reused once the requests are
        reported) in one gather for all of them: per request, the few torch ops cost more than
        the copy itself. Empty on CUDA, where the stock path copies."""
        cache = self._kv_cache
        if not self._is_tp_rank_zero or cache is None or cache.is_cuda:
            return {}
        if not self.has_connector_metadata():
            return {}
        pending = getattr(self._get_connector_metadata(), "pending_saves", [])
        if not pending:
            return {}
        # Runs on the engine's thread between steps (its torch ops on the engine's own OpenMP
        # threads), so no writer thread competes with the model's threads for the cores.
        size = self._block_size
        counts = [-(-len(p.token_ids) // size) for p in pending]
        blocks = [b for p, count in zip(pending, counts, strict=True) for b in p.block_ids[:count]]
        _, layers, _, hidden = cache.shape
        # [blocks, layers, block_size, hidden] → [blocks, block_size, layers, hidden], rounded to
        # bf16 (nearest even) in the same pass where the engine computes in float32.
        states = torch.empty((len(blocks), size, layers, hidden), dtype=torch.bfloat16)
        states.copy_(cache[torch.tensor(blocks)].transpose(1, 2))
        rows = states.flatten(0, 1)
        copied, start = {}, 0
        for p, count in zip(pending, counts, strict=True):
            copied[p.req_id] = rows[start : start + len(p.token_ids)]  # a contiguous view
            start += count * size
        return copied

    def _submit_async_write(self, pending: PendingSave) -> None:
        hidden = self._step_states.pop(pending.req_id, None)
        if hidden is None:  # CUDA: the stock asynchronous copy and write
            super()._submit_async_write(pending)
            return
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids}
        if self._kv_transfer_config.get_from_extra_config("in_memory", False):
            CAPTURED[pending.filename] = tensors
            self._req_copy_events[pending.req_id] = _WRITTEN
            return
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        # wait_for_save took the lock when the request was scheduled; take it here otherwise.
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            # Under its final name only when whole: a failed write leaves no file that the
            # reader, seeing the lock released, would take for the states.
            save_file(tensors, pending.filename + ".tmp")  # writes the view's own rows only
            os.replace(pending.filename + ".tmp", pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the lock: readers may load the file
        self._req_copy_events[pending.req_id] = _WRITTEN
