"""Recover Llama-3.1's ``rope_scaling`` from the ``rope_freqs`` tensor of a GGUF file.

llama.cpp does not store Llama-3's RoPE scaling parameters as metadata: its converter
writes one divisor per rotated pair (``rope_freqs.weight``, head_dim / 2 floats): 1 for
high frequencies, ``factor`` for low ones, a smooth blend between. Hugging Face instead
keeps ``{"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings}``. Only the divisors reach us, so we take the
parameters every Llama 3.x release uses (low 1, high 4, original context 8192, factor =
the largest divisor), recompute the divisors, and accept them only if they match: a file
made with other parameters raises rather than running with the wrong frequencies.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from inferpath.weights.errors import WeightsError

LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}


def llama3_rope_divisors(rope_theta: float, head_dim: int, scaling: dict[str, Any]) -> np.ndarray:
    """The per-pair divisors of the base inverse frequencies under llama3 scaling, (head_dim/2,)."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    divisors = []
    for wavelen in 2 * math.pi / inv_freq:
        if wavelen < old_context / high:
            divisors.append(1.0)
        elif wavelen > old_context / low:
            divisors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(divisors)


def rope_scaling_from_freqs(divisors: np.ndarray, rope_theta: float, head_dim: int,
                            path: Path) -> dict[str, Any] | None:
    """The Hugging Face rope_scaling dict the divisors came from (None if all are 1)."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if np.allclose(divisors, 1.0):
        return None
    scaling = {"rope_type": "llama3", "factor": float(divisors.max()), **LLAMA3_DEFAULTS}
    if divisors.shape != (head_dim // 2,) or not np.allclose(
            llama3_rope_divisors(rope_theta, head_dim, scaling), divisors, rtol=1e-4):
        raise WeightsError(
            f"{path}: tensor 'rope_freqs.weight' (shape {divisors.shape}, expected "
            f"({head_dim // 2},)) does not match Llama-3 RoPE scaling with factor "
            f"{scaling['factor']:g} and {LLAMA3_DEFAULTS}; this RoPE variant is not supported"
        )
    return scaling
