"""RoPE frequency scaling: how ``rope_scaling`` turns rope_theta into inverse frequencies.

Each type gives ``(inv_freq (head_dim / 2,) float32, attention_factor)``; the attention
factor multiplies cos and sin (YaRN and LongRoPE sharpen attention with it). Types:

- default: ``1 / theta^(2i / d)``.
- linear: all frequencies divided by ``factor``.
- llama3 (Llama-3.1): low frequencies divided by ``factor``, high ones kept, a smooth band.
- yarn: interpolated below the ``beta_slow`` rotation count, extrapolated above
  ``beta_fast``, a linear ramp between; attention factor ``0.1 ln(factor) + 1`` by default.
- dynamic (NTK): theta grows with the sequence length once it passes
  ``max_position_embeddings``.
- longrope (Phi-3): per-frequency divisors, ``short_factor`` up to
  ``original_max_position_embeddings`` tokens and ``long_factor`` beyond.

NOTE: dynamic and longrope depend on the length of the sequence being computed
(``LENGTH_DEPENDENT``): as in transformers, a step's tokens use the frequencies of their
own sequence's length after the step, and keys already cached keep the rotation they were
written with. Each sequence gets its own length here (transformers uses the longest
sequence of its batch), so a request's result does not depend on what shares its step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from inferpath.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
LENGTH_DEPENDENT = frozenset({"dynamic", "longrope"})


class RopeScalingError(ValueError):
    """The config asks for a RoPE scaling type inferpath does not implement."""


def rope_type(config: ModelConfig) -> str:
    scaling = config.rope_scaling_dict or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """1 / theta^(2i / dim) for the dim / 2 rotated pairs, float32."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta ** exponents)


def scaled_inv_freq(config: ModelConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim / 2,), attention_factor) of the config's RoPE at ``seq_len``.

    ``seq_len`` matters only for the LENGTH_DEPENDENT types (None: the short/original one).
    """
    dim, theta = config.rotary_dim or config.head_dim, config.rope_theta
    scaling = config.rope_scaling_dict or {}
    kind = rope_type(config)
    if kind == "default":
        return base_inv_freq(theta, dim), 1.0
    if kind == "linear":
        return base_inv_freq(theta, dim) / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3(base_inv_freq(theta, dim), scaling, config.max_position_embeddings), 1.0
    if kind == "yarn":
        return _yarn(theta, dim, scaling, config.max_position_embeddings)
    if kind == "dynamic":
        return _dynamic_ntk(theta, dim, float(scaling["factor"]), config.max_position_embeddings, seq_len), 1.0
    if kind == "longrope":
        return _longrope(theta, dim, scaling, config.max_position_embeddings, seq_len)
    raise RopeScalingError(f"rope_scaling type {kind!r} is not supported; supported types: "
                           f"{', '.join(SUPPORTED_ROPE_TYPES)}")


def _llama3(inv_freq: torch.Tensor, scaling: dict, max_positions: int) -> torch.Tensor:
    """Llama-3.1 frequency rescaling (wavelengths longer than the original context shrink)."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling.get("original_max_position_embeddings", max_positions))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(theta: float, dim: int, scaling: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    original = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        # the pair index whose wavelength fits num_rotations times into the original context
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: the pair keeps its frequency (fast rotations), 0: divided by factor
    return interpolated * (1 - keep) + extrapolated * keep, float(attention_factor)


def _dynamic_ntk(theta: float, dim: int, factor: float, max_positions: int, seq_len: int | None) -> torch.Tensor:
    seq_len = max(seq_len or max_positions, max_positions)
    theta = theta * ((factor * seq_len / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    return base_inv_freq(theta, dim)


def _longrope(theta: float, dim: int, scaling: dict[str, Any], max_positions: int,
              seq_len: int | None) -> tuple[torch.Tensor, float]:
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or max_positions / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    long = seq_len is not None and seq_len > original
    ext_factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    if ext_factors.shape != (dim // 2,):
        raise RopeScalingError(f"longrope {'long' if long else 'short'}_factor has {ext_factors.numel()} "
                               f"entries, expected head_dim / 2 = {dim // 2}")
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * theta ** shape), float(attention_factor)
