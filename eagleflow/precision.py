"""Whether a device multiplies bf16 matrices natively, which decides where bf16 is computed.

On CPUs without AVX512-BF16 or AMX (AVX2-only x86, e.g. many AMD EPYC hosts), torch emulates
bf16 matrix products: a [2048, 128] x [128, 352] product took 16.8 ms in bf16 against 1.6 ms in
float32 on such a machine. There, models that are stored in bf16 are computed in float32 and
their results rounded to bf16 where bf16 is what is kept.
"""

from __future__ import annotations

import torch


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """True on CUDA devices with bf16 and on CPUs with AVX512-BF16 or AMX tiles."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def compute_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """bf16 where it is native, else float32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def engine_dtype() -> str:
    """vLLM's compute dtype: bf16, the checkpoints' own, except on a CPU without native bf16,
    where float32 prefill ran ~6x faster (hidden states are rounded to bf16 when captured)."""
    if torch.cuda.is_available() or native_bf16("cpu"):
        return "bfloat16"
    return "float32"
