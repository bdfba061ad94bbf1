"""Modules that pick the faster CPU kernel for the shape at hand, applied from outside.

``accelerate(model)`` turns every ``nn.Linear`` of a built model into a ``CPULinear``,
every ``RMSNorm`` into a ``CPURMSNorm``, every ``SiluAndMul`` into a ``CPUSiluAndMul``,
every ``RotaryEmbedding`` into a ``CPURotaryEmbedding``, every ``PagedAttention`` into a
``CPUPagedAttention``, and fuses the Q/K/V and gate/up
projections (fused.py). All are subclasses, so module names, ``state_dict`` keys,
forward hooks and ``isinstance`` checks stay as they were, and the model file knows
nothing of them. They dispatch on dtype, device and rows:

- a batched decode step's matmuls: for bf16 on CPUs with AMX, 5 to 128 rows, a
  small-batch GEMM that streams the weights straight into AMX tiles (csrc/amx.c);
  otherwise a GEMV that reads each weight once at close to memory bandwidth (fp32 up to
  32 rows, bf16 up to 8); bf16 weights meeting float32 activations (kernels/bf16_weights.py)
  take a GEMV that widens them in the kernel, or widened tiles and PyTorch's GEMM;
- RMSNorm, the SwiGLU gate (``SiluAndMul``) and RoPE on Q and K, any number of rows:
  one pass each;
- the decode group of any step (one query per sequence, any batch size): attention that
  reads each sequence's keys and values in place through its block table, with no
  gathered copy and no mask tensor;
- anything else (more rows, prefill attention, other dtypes or devices): the parent's
  forward, as before.

NOTE: tried and left out: reordering bf16 weights once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) for batched steps. It doubles the weights'
memory (the plain copy stays for the GEMV, the embedding and ``state_dict``) and a
batch-32 engine step measured no faster (100 vs 103 ms, interleaved A/B on SmolLM2).
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.kernels import bf16_weights, build, ops
from inferpath.kernels.decode_stack import CPUDecoderStack
from inferpath.kernels.fused import CPUSelfAttention, CPUSwiGLUMLP
from inferpath.kernels.ops import (run_paged_decode_attention, run_prefill_attention, run_rms_norm, run_rope,
                                   run_silu_mul, small_batch_linear)
from inferpath.model.attention import PagedAttention
from inferpath.model.attention_plan import DecodeGroup, PrefillChunk
from inferpath.model.layers import RMSNorm, SiluAndMul, SwiGLUMLP
from inferpath.model.rope import RotaryEmbedding
from inferpath.model.self_attention import SelfAttention
from inferpath.model.transformer import DecoderStack


class CPULinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses a native kernel for a batch of few rows (module doc)."""

    def prepare(self) -> "CPULinear":
        """Decide the kernels for the current weight (call again after replacing it)."""
        self._kernels = ops.linear_kernels(self.weight, self.bias)
        self._widening = self.weight.dtype == torch.bfloat16 and (self.bias is None
                                                                  or self.bias.dtype == torch.float32)
        if self._widening:  # bf16 weights may meet float32 x (kernels/bf16_weights.py)
            self._widening_kernels = bf16_weights.bf16_weight_kernels(self.weight, self.bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in_features) -> (num_tokens, out_features)
        if self._widening and x.dtype == torch.float32:
            return bf16_weights.bf16_weight_linear(x, self.weight, self.bias, self._widening_kernels)
        return small_batch_linear(x, self.weight, self.bias, self._kernels)


class CPURMSNorm(RMSNorm):
    """An ``RMSNorm`` whose forward is the native one-pass kernel (module doc)."""

    def prepare(self) -> "CPURMSNorm":
        dtype = self.weight.dtype
        self._kernel = build.native_rms_norm(dtype) if ops.kernel_ready(dtype, self.weight) else None
        return self

    @property
    def has_native_kernel(self) -> bool:
        """Whether rows of the weight's dtype run the native kernel."""
        return self._kernel is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        if (self._kernel is not None and x.dim() == 2 and x.dtype == self.weight.dtype
                and x.device.type == "cpu"):
            return run_rms_norm(self._kernel, x.contiguous(), self.weight, self.eps)
        return super().forward(x)


class CPUSiluAndMul(SiluAndMul):
    """The SwiGLU gate in one native pass, in place in ``gate`` like its parent."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        fn = build.native_silu_mul(gate.dtype)
        if (fn is not None and gate.device.type == "cpu" and up.dtype == gate.dtype and gate.dim() == 2
                and gate.shape == up.shape and gate.stride(1) == 1 and up.stride(1) == 1):
            return run_silu_mul(fn, gate, up)
        return super().forward(gate, up)


class CPURotaryEmbedding(RotaryEmbedding):
    """RoPE on Q and K in one native pass (rotate-half, the same cos/sin rows)."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        fn = build.native_rope(q.dtype)
        head_dim = q.shape[-1]
        if (fn is None or q.device.type != "cpu" or k.dtype != q.dtype or head_dim % 32
                or q.stride(-1) != 1 or k.stride(-1) != 1 or q.stride(1) != head_dim or k.stride(1) != head_dim):
            return super().forward(positions, q, k)
        cos, signed_sin = self.table.cos_sin(positions, q.dtype)  # (tokens, 1, head_dim) each
        return run_rope(fn, q, k, cos.reshape(-1, head_dim).contiguous(),
                        signed_sin.reshape(-1, head_dim).contiguous())


class CPUPagedAttention(PagedAttention):
    """``PagedAttention`` whose decode group runs the native kernel: each sequence's keys
    and values are read in place through its block table, with no gathered copy and no
    mask tensor. Prompt chunks run the native prefill attention where it is built (avx512,
    avxvnni and avx2):
    causal over the chunk's own keys, or over its cached context and its own keys read
    through the block table, only the keys at or before each query read; chunks under a
    sliding window keep PyTorch's SDPA."""

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, scale: float) -> torch.Tensor:
        cached = chunk.block_ids is not None  # keys read from the cache (of its dtype), else from k and v
        fn = build.native_prefill_attention(q.dtype, kv_dtype=k_cache.dtype if cached else None)
        if (fn is None or chunk.windowed or q.device.type != "cpu" or q.shape[-1] > ops.ATTENTION_MAX_HEAD_DIM
                or q.shape[1] % k.shape[1] or q.shape[1] // k.shape[1] > ops.ATTENTION_MAX_GROUP
                or k.dtype != q.dtype or v.dtype != q.dtype
                or any(t.stride(2) != 1 or t.stride(1) != t.shape[2] for t in (q, k, v))
                or (cached and (v_cache.dtype != k_cache.dtype or not k_cache.is_contiguous()
                                or not v_cache.is_contiguous() or chunk.block_ids.dtype != torch.int64))):
            return PagedAttention._prefill(q, k, v, k_cache, v_cache, chunk, scale)
        rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        if chunk.block_ids is None:
            return run_prefill_attention(fn, q[rows], k[rows], v[rows], scale)
        return run_prefill_attention(fn, q[rows], k_cache, v_cache, scale, chunk.block_ids.contiguous(),
                                     chunk.seq_len - chunk.query_len)

    def _decode(self, q, k_cache, v_cache, group: DecodeGroup, scale: float) -> torch.Tensor:
        fn = build.native_paged_attention(q.dtype, kv_dtype=k_cache.dtype)  # None for a pair it lacks
        num_kv_heads, head_dim = k_cache.shape[-2:]
        if (fn is None or q.device.type != "cpu" or v_cache.dtype != k_cache.dtype
                or not k_cache.is_contiguous() or not v_cache.is_contiguous()
                or head_dim > ops.ATTENTION_MAX_HEAD_DIM
                or q.shape[1] // num_kv_heads > ops.ATTENTION_MAX_GROUP):
            return PagedAttention._decode(q, k_cache, v_cache, group, scale)
        tables = group.block_ids.view(group.seq_lens.shape[0], group.blocks_per_seq)
        return run_paged_decode_attention(fn, q.contiguous(), k_cache, v_cache, tables,
                                          group.seq_lens.contiguous(), scale, group.sliding_window)


# PyTorch module -> its CPU subclass. Parents come before children in ``model.modules()``,
# so the fused modules re-point their projections' weights before those are prepared.
_SWAPS = {
    SelfAttention: CPUSelfAttention,
    SwiGLUMLP: CPUSwiGLUMLP,
    nn.Linear: CPULinear,
    RMSNorm: CPURMSNorm,
    SiluAndMul: CPUSiluAndMul,
    RotaryEmbedding: CPURotaryEmbedding,
    PagedAttention: CPUPagedAttention,
    DecoderStack: CPUDecoderStack,  # a decode step's layers in one native call
}
_SWAPS.update({cpu: cpu for cpu in list(_SWAPS.values())})  # idempotent


def accelerate(model: nn.Module) -> int:
    """Swap every module ``_SWAPS`` names for its CPU subclass and prepare the ones that
    hold weights; returns how many modules were swapped.

    Idempotent. Call after the weights are loaded (and after tensor-parallel sharding).
    """
    count = 0
    for module in model.modules():
        cpu_class = _SWAPS.get(type(module))
        if cpu_class is None:
            continue
        module.__class__ = cpu_class
        if hasattr(module, "prepare"):
            module.prepare()
        count += 1
    return count
