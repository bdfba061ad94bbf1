"""Fused projections, applied from outside: one matmul for Q, K and V, one for gate and up.

A decode step's matmuls are small (SmolLM2's K and V projections are 192 x 576), and a
small matmul pays its fixed costs (dispatch, a thread fork and join, prefetch ramp-up) on
little work. ``CPUSelfAttention`` and ``CPUSwiGLUMLP`` concatenate the weights once, at
load, into one (q + k + v, hidden) and one (2 x intermediate, hidden) matrix, and point
the original ``q_proj.weight`` etc. at row slices of it: no extra memory, and
``state_dict`` still has every tensor under its checkpoint name. Measured over one
decode step's SmolLM2 bf16 matrices (``fuse.py`` in the issue note): batch 1 through the
GEMV kernel 18.3 -> 16.2 ms, batch 32 through oneDNN 41.5 -> 35.3 ms.

NOTE: the fused path skips the ``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``
and ``act_fn`` modules' own calls, so it steps aside whenever any of them has a forward
hook: ``inferpath trace`` still times every projection on its own.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.kernels import build, ops
from inferpath.kernels.ops import run_silu_mul, small_batch_linear
from inferpath.model.layers import SwiGLUMLP
from inferpath.model.self_attention import SelfAttention


def _hooked(*modules: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _fuse(linears: list[nn.Linear], attr: str) -> torch.Tensor | None:
    """Concatenate the linears' ``attr`` tensors along rows and re-point each at its slice."""
    tensors = [getattr(linear, attr) for linear in linears]
    if any(t is None for t in tensors):
        return None
    fused = torch.cat([t.detach() for t in tensors], dim=0)
    start = 0
    for linear, tensor in zip(linears, tensors):
        rows = tensor.shape[0]
        getattr(linear, attr).data = fused[start:start + rows]
        start += rows
    return fused


def quant_group(*projections: nn.Module):
    """An ``ops.QuantGroup`` over quantized projections (QuantLinear) sharing an input, or
    None where they are not all quantized or the kernel does not run here."""
    from inferpath.kernels.quantized import QuantLinear

    fn = build.native_quant_matmul_group()
    if fn is None or not all(isinstance(p, QuantLinear) for p in projections):
        return None
    biases = [None if p.bias is None else p.bias.detach().float().contiguous() for p in projections]
    return ops.QuantGroup(fn, [p.qweight for p in projections], biases)


def _can_fuse(*linears: nn.Module) -> bool:
    if not all(isinstance(linear, nn.Linear) for linear in linears):  # e.g. quantized (QuantLinear)
        return False
    return ops.kernel_ready(linears[0].weight.dtype, *(linear.weight for linear in linears))


class CPUSelfAttention(SelfAttention):
    """``SelfAttention`` whose Q, K and V come out of one matmul (module doc)."""

    def prepare(self) -> "CPUSelfAttention":
        projections = [self.q_proj, self.k_proj, self.v_proj]
        self._qkv_weight = self._qkv_bias = None
        self._quant_qkv = quant_group(*projections)
        self._sizes = [p.out_features for p in projections]
        if not _can_fuse(*projections):
            return self
        self._qkv_weight = _fuse(projections, "weight")
        self._qkv_bias = _fuse(projections, "bias")
        self._kernels = ops.linear_kernels(self._qkv_weight, self._qkv_bias)
        self._sizes = [p.weight.shape[0] for p in projections]
        return self

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        quant = self._quant_qkv is not None and x.dtype == torch.float32
        if (self._qkv_weight is None and not quant) or _hooked(self.q_proj, self.k_proj, self.v_proj):
            return super().project(x)
        num_tokens = x.shape[0]
        if quant:
            qkv = self._quant_qkv(x.contiguous())  # (tokens, q + 2 kv), weights read in place
        else:
            qkv = small_batch_linear(x, self._qkv_weight, self._qkv_bias, self._kernels)  # (tokens, q + 2 kv)
        q, k, v = qkv.split(self._sizes, dim=-1)  # views: rows keep the fused stride
        return (q.view(num_tokens, self.num_heads, self.head_dim),
                k.view(num_tokens, self.num_kv_heads, self.head_dim),
                v.view(num_tokens, self.num_kv_heads, self.head_dim))


class CPUSwiGLUMLP(SwiGLUMLP):
    """``SwiGLUMLP`` whose gate and up projections are one matmul, gated in one native pass
    that reads both halves in place (module doc)."""

    def prepare(self) -> "CPUSwiGLUMLP":
        self._gate_up_weight = self._silu = None
        self._quant_gate_up = quant_group(self.gate_proj, self.up_proj)
        self._silu_f32 = build.native_silu_mul(torch.float32)
        if not _can_fuse(self.gate_proj, self.up_proj) or self.gate_proj.bias is not None:
            return self
        self._silu = build.native_silu_mul(self.gate_proj.weight.dtype)
        if self._silu is None:
            return self
        self._gate_up_weight = _fuse([self.gate_proj, self.up_proj], "weight")
        self._kernels = ops.linear_kernels(self._gate_up_weight, None)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size) -> (num_tokens, hidden_size)
        quant = self._quant_gate_up is not None and self._silu_f32 is not None and x.dtype == torch.float32
        if (self._gate_up_weight is None and not quant) or _hooked(self.gate_proj, self.up_proj, self.act_fn):
            return super().forward(x)
        if quant:
            gate_up = self._quant_gate_up(x.contiguous())  # (tokens, 2 * inter), weights read in place
            inter = gate_up.shape[1] // 2
            hidden = torch.empty((x.shape[0], inter), dtype=x.dtype)
            run_silu_mul(self._silu_f32, gate_up[:, :inter], gate_up[:, inter:], hidden)
            return self.down_proj(hidden)
        gate_up = small_batch_linear(x, self._gate_up_weight, None, self._kernels)  # (tokens, 2 * inter)
        inter = gate_up.shape[1] // 2
        hidden = torch.empty((x.shape[0], inter), dtype=x.dtype)
        run_silu_mul(self._silu, gate_up[:, :inter], gate_up[:, inter:], hidden)
        return self.down_proj(hidden)
