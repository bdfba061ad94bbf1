"""Fused projections, applied from outside: one matmul call for Q, K and V, one for gate and up.

A decode step's matmuls are small (SmolLM2's K and V projections are 192 x 576), and a
small matmul pays its fixed costs (dispatch, a thread fork and join, prefetch ramp-up) on
little work. ``CPUSelfAttention`` and ``CPUSwiGLUMLP`` run each group of projections
sharing an input as one native call over the separate weights, read where they lie
(kernels/groups.py: a ``QuantGroup`` over GGUF blocks, a ``FloatGroup`` through the
GEMV): no concatenated copy, so a BF16 GGUF's matrices stay the file's mapped pages
alone, and ``state_dict`` is untouched. Row counts the GEMV does not serve (AMX, oneDNN
batches) run the projections one by one. Measured over the Q/K/V and gate/up matrices of
SmolLM2's 30 layers (bf16, one row, weights not in cache, AMD EPYC, 1 thread): one GEMV
call per group 4.9 ms against 5.6 ms for the projections one by one.

NOTE: the fused path skips the ``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``
and ``act_fn`` modules' own calls, so it steps aside whenever any of them has a forward
hook: ``inferpath trace`` still times every projection on its own.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.kernels import bf16_weights, build, ops, workspace
from inferpath.kernels.groups import FloatGroup, QuantGroup
from inferpath.kernels.ops import run_silu_mul
from inferpath.model.layers import SwiGLUMLP
from inferpath.model.self_attention import SelfAttention


def _hooked(*modules: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def quant_group(*projections: nn.Module) -> QuantGroup | None:
    """A ``QuantGroup`` over quantized projections (QuantLinear) sharing an input, or None
    where they are not all quantized or the kernel does not run here."""
    from inferpath.kernels.quantized import QuantLinear

    fn = build.native_quant_matmul_group()
    if fn is None or not all(isinstance(p, QuantLinear) for p in projections):
        return None
    biases = [None if p.bias is None else p.bias.detach().float().contiguous() for p in projections]
    return QuantGroup(fn, [p.qweight for p in projections], biases)


def float_group(*projections: nn.Module) -> FloatGroup | None:
    """A ``FloatGroup`` over float ``nn.Linear`` projections sharing an input (one dtype,
    contiguous CPU weights), for each activation dtype the native GEMV serves them in (x of
    the weights' dtype with biases of it or none; float32 x against bf16 weights with
    float32 biases or none), or None where there is none."""
    if not all(isinstance(p, nn.Linear) for p in projections):  # e.g. quantized (QuantLinear)
        return None
    weights = [p.weight.detach() for p in projections]
    biases = [None if p.bias is None else p.bias.detach() for p in projections]
    dtype = weights[0].dtype
    if not ops.kernel_ready(dtype, *weights) or len({w.shape[1] for w in weights}) != 1:
        return None
    variants = {}
    fn, kernels = build.native_gemv_group(dtype), ops.linear_kernels(weights[0], biases[0])
    if fn is not None and kernels[0] is not None and ops.kernel_ready(dtype, *biases):
        variants[dtype] = (fn, kernels)
    fn, kernels = build.native_gemv_group_bf16_weights(), bf16_weights.bf16_weight_kernels(weights[0], biases[0])
    if dtype == torch.bfloat16 and fn is not None and kernels[0] is not None \
            and ops.kernel_ready(torch.float32, *biases):
        variants[torch.float32] = (fn, kernels)
    return FloatGroup(weights, biases, variants) if variants else None


def _group_serves(x: torch.Tensor, quant: QuantGroup | None, floats: FloatGroup | None) -> str:
    """Which group runs x here: "quant", "float", or "" (the projections one by one)."""
    rows = x.shape[0]
    if quant is not None and x.dtype == torch.float32:  # any row count: QuantGroup tiles past the fused rows
        return "quant"
    if floats is not None and x.dim() == 2 and floats.serves(rows, x.dtype):
        return "float"
    return ""


class CPUSelfAttention(SelfAttention):
    """``SelfAttention`` whose Q, K and V come out of one matmul call (module doc)."""

    def prepare(self) -> "CPUSelfAttention":
        projections = [self.q_proj, self.k_proj, self.v_proj]
        self._quant_qkv = quant_group(*projections)
        self._float_qkv = float_group(*projections)
        self._sizes = [p.out_features for p in projections]
        return self

    def qkv_group(self, quantized: bool) -> QuantGroup | FloatGroup | None:
        """The group Q/K/V run through: over GGUF blocks (``quantized``) or float weights;
        None where there is none."""
        return self._quant_qkv if quantized else self._float_qkv

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        group = _group_serves(x, self._quant_qkv, self._float_qkv)
        if not group or _hooked(self.q_proj, self.k_proj, self.v_proj):
            return super().project(x)
        num_tokens = x.shape[0]
        # qkv: (tokens, q + 2 kv), the weights read in place
        qkv = (self._quant_qkv if group == "quant" else self._float_qkv)(x.contiguous())
        q, k, v = qkv.split(self._sizes, dim=-1)  # views: rows keep the fused stride
        return (q.view(num_tokens, self.num_heads, self.head_dim),
                k.view(num_tokens, self.num_kv_heads, self.head_dim),
                v.view(num_tokens, self.num_kv_heads, self.head_dim))


class CPUSwiGLUMLP(SwiGLUMLP):
    """``SwiGLUMLP`` whose gate and up projections are one matmul call, gated in one native
    pass that reads both halves in place (module doc)."""

    def prepare(self) -> "CPUSwiGLUMLP":
        self._quant_gate_up = quant_group(self.gate_proj, self.up_proj)
        self._float_gate_up = float_group(self.gate_proj, self.up_proj)
        self._silu = {dtype: build.native_silu_mul(dtype) for dtype in (torch.float32, torch.bfloat16)}
        if self._quant_gate_up is not None and self._silu[torch.float32] is None:
            self._quant_gate_up = None
        return self

    def gate_up_group(self, quantized: bool) -> QuantGroup | FloatGroup | None:
        """The group gate and up run through (as ``CPUSelfAttention.qkv_group``)."""
        return self._quant_gate_up if quantized else self._float_gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size) -> (num_tokens, hidden_size)
        group = _group_serves(x, self._quant_gate_up, self._float_gate_up)
        if not group or self._silu.get(x.dtype) is None or _hooked(self.gate_proj, self.up_proj, self.act_fn):
            return super().forward(x)
        # gate_up: (tokens, 2 * inter), the weights read in place
        gate_up = (self._quant_gate_up if group == "quant" else self._float_gate_up)(x.contiguous())
        inter = gate_up.shape[1] // 2
        hidden = workspace.empty((x.shape[0], inter), x.dtype)
        run_silu_mul(self._silu[x.dtype], gate_up[:, :inter], gate_up[:, inter:], hidden)
        return self.down_proj(hidden)
