"""Per-token layers: RMSNorm and the gated feed-forward network (SwiGLU or GeGLU).

Neither lets one token see another: every row of the (num_tokens, hidden_size) input is
processed alone. The SwiGLU MLP holds most of a layer's parameters (the seed: 82 percent
for Llama-3-70B).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 as Hugging Face does.

    For float32 inputs this is one fused ``F.rms_norm`` call; for half types the
    normalisation runs in float32 (also fused) and the weight multiplies after casting
    back, which is the order transformers uses (so bf16 logits match it more often).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.hidden_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        # x * rsqrt(mean(x^2) + eps) in float32 by one fused op, then cast, then weight
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the stored weight w scales by ``1 + w``, in float32, then casts.

    Its own class (not a flag): the native RMSNorm kernel, swapped in by exact type, does
    not know the offset.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., hidden_size)
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(size: int, eps: float, weight_offset: float = 0.0) -> RMSNorm:
    """RMSNorm over ``size`` features; Gemma's ``1 + w`` variant when ``weight_offset`` is 1."""
    if weight_offset not in (0.0, 1.0):
        raise ValueError(f"norm weight offset must be 0 or 1, got {weight_offset}")
    return OffsetRMSNorm(size, eps) if weight_offset else RMSNorm(size, eps)


class SiluAndMul(nn.Module):
    """The SwiGLU gate: ``silu(gate) * up``, elementwise. Its own module so it can be timed.

    NOTE: computed in place in ``gate`` (the gate projection's fresh output, used nowhere
    else): a prefill's (num_tokens, intermediate_size) temporaries are the largest
    activations of a layer, and not allocating two more of them is measurably faster.
    """

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        # gate, up: (num_tokens, intermediate_size)
        return F.silu(gate, inplace=True).mul_(up)


class GeluAndMul(nn.Module):
    """The GeGLU gate: ``gelu(gate) * up``, exact erf GELU or its tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        # gate, up: (num_tokens, intermediate_size)
        return F.gelu(gate, approximate=self.approximate).mul_(up)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)): expand, gate, compress.

    Submodules keep Hugging Face's names (``gate_proj``, ``up_proj``, ``down_proj``) so
    checkpoint tensors load by name; ``act_fn`` is the SiLU-and-multiply stage. With
    ``bias`` (Llama's ``mlp_bias``) all three projections carry a bias.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.act_fn = self.make_activation()
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def make_activation(self) -> nn.Module:
        return SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size) -> (num_tokens, hidden_size)
        return self.down_proj(self.act_fn(self.gate_proj(x), self.up_proj(x)))


class GeGLUMLP(SwiGLUMLP):
    """``SwiGLUMLP`` gated by GELU instead of SiLU (``hidden_act`` gelu / gelu_pytorch_tanh).

    A class of its own, not a flag: the native kernels (kernels/) swap ``SwiGLUMLP`` and
    ``SiluAndMul`` by exact type for SiLU-only fused paths, and must never take this one.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 approximate: str = "none") -> None:
        self.approximate = approximate
        super().__init__(hidden_size, intermediate_size, bias)

    def make_activation(self) -> nn.Module:
        return GeluAndMul(self.approximate)


def gated_mlp(hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool) -> SwiGLUMLP:
    """The gated MLP for a config's ``hidden_act`` (silu, gelu or gelu_pytorch_tanh)."""
    if hidden_act == "silu":
        return SwiGLUMLP(hidden_size, intermediate_size, bias)
    approximate = {"gelu": "none", "gelu_pytorch_tanh": "tanh"}[hidden_act]
    return GeGLUMLP(hidden_size, intermediate_size, bias, approximate)
