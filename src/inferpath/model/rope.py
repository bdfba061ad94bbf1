"""Rotary position embedding (RoPE): position enters by rotating Q and K, never V.

Hugging Face's "rotate half" convention: a head vector of ``head_dim`` numbers is read as
``head_dim / 2`` pairs ``(x[i], x[i + head_dim/2])``, and pair ``i`` is rotated by the
angle ``position * inv_freq[i]``. RoPE has no learned parameters; everything here is
derived from ``ModelConfig`` (rope_theta and rope_scaling).

Supported ``rope_scaling`` types: none/"default", "linear" (all frequencies divided by
``factor``) and "llama3" (Llama-3.1: low frequencies divided by ``factor``, high ones
kept, the band between interpolated smoothly). Any other type raises ``RopeScalingError``
instead of silently producing a model that answers differently from its reference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from inferpath.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class RopeScalingError(ValueError):
    """The config asks for a RoPE scaling type inferpath does not implement."""


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (head_dim / 2,) float32, after the config's rope_scaling."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)  # (head_dim / 2,)
    scaling = config.rope_scaling_dict
    if not scaling:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling, config.max_position_embeddings)
    raise RopeScalingError(
        f"rope_scaling type {rope_type!r} is not supported; supported types: "
        f"{', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict, max_positions: int) -> torch.Tensor:
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


class RopeTable:
    """cos and signed sin of every position up to a length, shared by all layers of a model.

    Invariant: both tables are (num_positions, head_dim) in the rotate-half layout: cos is
    ``[cos(p f), cos(p f)]`` and the signed sin ``[-sin(p f), sin(p f)]``, so that
    ``rotate_half(x) * sin == roll(x, head_dim / 2) * signed_sin`` (one op fewer per use).
    The table grows (doubling) when a step needs a longer context; the caller passes that
    length from host-side metadata, so growing never reads a device tensor. Built in
    float32 and cast once per (device, dtype).
    """

    def __init__(self, config: ModelConfig, initial_positions: int = 4096) -> None:
        self.inv_freq = rope_inv_freq(config)  # (head_dim / 2,)
        self.num_positions = 0
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._initial = min(initial_positions, config.max_position_embeddings)
        self._step: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def ensure(self, num_positions: int) -> None:
        """Make positions ``0 .. num_positions - 1`` available (no-op when they are)."""
        if num_positions <= self.num_positions:
            return
        size = max(self._initial, self.num_positions, 1)
        while size < num_positions:
            size *= 2
        positions = torch.arange(size, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)  # (size, head_dim / 2)
        cos = torch.cat((freqs.cos(), freqs.cos()), dim=-1)  # (size, head_dim)
        signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
        self._tables = {(torch.device("cpu"), torch.float32): (cos, signed_sin)}
        self.num_positions = size

    def begin_step(self, positions: torch.Tensor, dtype: torch.dtype, num_positions: int) -> None:
        """Look up this step's rows once for all layers (``cos_sin`` then reuses them).

        Called by the model at the start of every forward, so a caller that refills one
        persistent positions buffer between steps still gets fresh rows.
        """
        self.ensure(num_positions)
        self._step = None
        cos, signed_sin = self.cos_sin(positions, dtype)
        self._step = (positions, dtype, cos, signed_sin)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin rows for ``positions`` (num_tokens,) -> each (num_tokens, 1, head_dim)."""
        step = self._step
        if step is not None and step[0] is positions and step[1] == dtype:
            return step[2], step[3]
        self.ensure(1)
        key = (positions.device, dtype)
        table = self._tables.get(key)
        if table is None:
            cos32, sin32 = self._tables[(torch.device("cpu"), torch.float32)]
            table = (cos32.to(positions.device, dtype), sin32.to(positions.device, dtype))
            self._tables[key] = table
        cos, signed_sin = table
        # (num_tokens, 1, head_dim): broadcast over heads
        return cos.index_select(0, positions).unsqueeze(1), signed_sin.index_select(0, positions).unsqueeze(1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to Q and K of one layer: ``rotary_emb(positions, q, k) -> (q, k)``.

    q: (num_tokens, num_heads, head_dim), k: (num_tokens, num_kv_heads, head_dim).
    x -> x cos + rotate_half(x) sin, with rotate_half(x) = [-x2, x1] for the halves x1, x2.
    Each layer has its own instance (so a forward hook on ``layers[i].self_attn.rotary_emb``
    fires once per layer) but all share one ``RopeTable``.
    """

    def __init__(self, table: RopeTable) -> None:
        super().__init__()
        self.table = table

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, signed_sin = self.table.cos_sin(positions, q.dtype)
        half = q.shape[-1] // 2
        q_rot = (q * cos).addcmul_(q.roll(half, dims=-1), signed_sin)
        k_rot = (k * cos).addcmul_(k.roll(half, dims=-1), signed_sin)
        return q_rot, k_rot
