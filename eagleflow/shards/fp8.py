"""Lossy fp8 storage of bf16 activations: float8 e4m3 codes with a per-channel scale per chunk.

A block of rows (one zarr chunk of an activation array, `[rows, *channels]`) is stored as

    codes  uint8   [rows, *channels]   float8_e4m3fn bit patterns of value / scale
    scale  float32 [*channels]         max |value| of the channel over the block / 448

and decoded as `bf16(e4m3(codes) * scale)`. Why per channel: the large outliers of LLM
residual streams ("massive activations", up to ~1e5x the median) sit in a few fixed channels.
A scale per token would crush every other channel of the tokens that carry them into e4m3's
subnormals; a scale per channel confines the loss to those few channels. Computed per chunk,
the scale needs no pass over the data ahead of time and keeps the writer streaming.
e4m3 keeps 3 mantissa bits: relative error per value at most 2^-4, ~2-3% in norm.
"""

from __future__ import annotations

import numpy as np
import torch

E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def quantize(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp8 codes and per-channel scales of a block of bf16 values given as uint16 bit
    patterns `[rows, *channels]`. Raises on non-finite values (they have no fp8 code)."""
    bits = np.require(bits, requirements=["C", "W"])
    values = torch.from_numpy(bits).view(torch.bfloat16).float()
    if not torch.isfinite(values).all():
        raise ValueError("fp8 storage: the activations hold inf or NaN")
    amax = values.abs().amax(dim=0)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scaled = (values / scale).clamp_(-E4M3_MAX, E4M3_MAX)  # float rounding may pass 448
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.numpy(), scale.numpy()


def dequantize(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) that fp8 `codes` with per-channel `scale` decode to."""
    codes = np.require(codes, requirements=["C", "W"])  # torch wants writable memory
    values = torch.from_numpy(codes).view(torch.float8_e4m3fn).float()
    values *= torch.from_numpy(np.require(scale, np.float32, ["C", "W"]))
    return values.to(torch.bfloat16).view(torch.uint16).numpy()
