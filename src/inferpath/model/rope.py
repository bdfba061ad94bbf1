"""Rotary position embedding (RoPE): position enters by rotating Q and K, never V.

Hugging Face's "rotate half" convention: a head vector of ``head_dim`` numbers is read as
``head_dim / 2`` pairs ``(x[i], x[i + head_dim/2])``, and pair ``i`` is rotated by the
angle ``position * inv_freq[i]``. RoPE has no learned parameters; everything here is
derived from ``ModelConfig`` (rope_theta and rope_scaling).

The ``rope_scaling`` types and their frequencies live in rope_scaling.py; any other type
raises ``RopeScalingError`` instead of silently producing a model that answers differently
from its reference.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.rope_scaling import (LENGTH_DEPENDENT, SUPPORTED_ROPE_TYPES, RopeScalingError,
                                          rope_type, scaled_inv_freq)

__all__ = ["PartialRotaryEmbedding", "RopeScalingError", "RopeTable", "RotaryEmbedding", "SUPPORTED_ROPE_TYPES",
           "rope_inv_freq"]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (rotary_dim / 2,) float32, after the config's rope_scaling."""
    return scaled_inv_freq(config)[0]


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
        self.config = config
        self.inv_freq, self.attention_factor = scaled_inv_freq(config)  # (head_dim / 2,), float
        self.length_dependent = rope_type(config) in LENGTH_DEPENDENT
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
        cos, signed_sin = self._cos_sin(torch.outer(positions, self.inv_freq))  # (size, head_dim) each
        self._tables = {(torch.device("cpu"), torch.float32): (cos, signed_sin)}
        self.num_positions = size

    def _cos_sin(self, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Angles (n, head_dim / 2) -> cos, signed sin (n, head_dim), times the attention factor."""
        cos = torch.cat((freqs.cos(), freqs.cos()), dim=-1)
        signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
        if self.attention_factor != 1.0:
            cos, signed_sin = cos * self.attention_factor, signed_sin * self.attention_factor
        return cos, signed_sin

    def begin_step(self, positions: torch.Tensor, dtype: torch.dtype, num_positions: int,
                   meta=None) -> None:
        """Look up this step's rows once for all layers (``cos_sin`` then reuses them).

        Called by the model at the start of every forward, so a caller that refills one
        persistent positions buffer between steps still gets fresh rows. For a
        length-dependent RoPE (rope_scaling.py) ``meta`` (AttentionMetadata) gives each
        token's sequence length, and the rows are computed from it instead of looked up.
        """
        self.ensure(num_positions)
        self._step = None
        if self.length_dependent and meta is not None:
            cos, signed_sin = self._length_dependent_rows(positions, meta)
            cos, signed_sin = cos.to(dtype).unsqueeze(1), signed_sin.to(dtype).unsqueeze(1)
        else:
            cos, signed_sin = self.cos_sin(positions, dtype)
        self._step = (positions, dtype, cos, signed_sin)

    def _length_dependent_rows(self, positions: torch.Tensor, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin (num_tokens, head_dim) float32, each token at its sequence's length."""
        by_length = {n: scaled_inv_freq(self.config, n)[0] for n in set(meta.seq_lens_list)}
        rows = [by_length[n].expand(q, -1) for n, q in zip(meta.seq_lens_list, meta.query_lens)]
        inv_freq = torch.cat(rows).to(positions.device)  # (num_tokens, head_dim / 2)
        return self._cos_sin(positions.to(torch.float32).unsqueeze(1) * inv_freq)

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


class PartialRotaryEmbedding(RotaryEmbedding):
    """RoPE on the first ``rotary_dim`` dimensions of each head only (GLM-4), rotate-half
    within them; the rest pass through. Its own class: the native RoPE kernel, swapped in
    by exact type, turns whole heads."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q: (num_tokens, num_heads, head_dim); the table's rows are (num_tokens, 1, rotary_dim)
        cos, signed_sin = self.table.cos_sin(positions, q.dtype)
        dim = cos.shape[-1]
        return self._turn(q, cos, signed_sin, dim), self._turn(k, cos, signed_sin, dim)

    @staticmethod
    def _turn(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, dim: int) -> torch.Tensor:
        rot = x[..., :dim]
        turned = (rot * cos).addcmul_(rot.roll(dim // 2, dims=-1), signed_sin)
        return torch.cat((turned, x[..., dim:]), dim=-1)
