"""gpt-oss's experts over GGUF blocks read in place (MXFP4, or any format the kernels read).

``FusedExperts`` (model/moe.py) holds every expert in two stacked float tensors; a GGUF
file holds them as three stacked block tensors, one row per output (llama.cpp's
``ffn_{gate,up,down}_exps``). Loaded with ``keep_quantized``, weights/gguf_stacked.py names
each expert's blocks ``mlp.experts.{gate,up,down}_proj.E.weight``; ``swap_quantized_experts``
then replaces each ``FusedExperts`` whose blocks are there by a ``QuantFusedExperts``, whose
``expert`` is the same clamped SwiGLU over three ``QuantLinear`` per expert (the fused
dequantize-dot kernels, csrc/quant). Its biases stay float, under the checkpoint's names.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from inferpath.kernels.quantized import QuantLinear
from inferpath.model.moe import FusedExperts

_EXPERT_BLOCKS = re.compile(r"^(.*\.mlp\.experts)\.(gate|up|down)_proj\.(\d+)\.weight$")


class QuantFusedExperts(nn.Module):
    """``FusedExperts`` with its matrices as blocks: ``gate``, ``up``, ``down`` hold one
    ``QuantLinear`` per expert (inter x hidden, inter x hidden, hidden x inter)."""

    def __init__(self, dense: FusedExperts, gate: list, up: list, down: list) -> None:
        super().__init__()
        num_experts, hidden, inter2 = dense.gate_up_proj.shape
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, inter2), requires_grad=False)
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)
        self.gate = nn.ModuleList(QuantLinear(w) for w in gate)
        self.up = nn.ModuleList(QuantLinear(w) for w in up)
        self.down = nn.ModuleList(QuantLinear(w) for w in down)
        self.limit, self.alpha = dense.limit, dense.alpha
        self.num_experts = num_experts

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its tokens x: (num_routed, hidden) -> (num_routed, hidden)."""
        bias = self.gate_up_proj_bias[e]  # gate in the even entries, up in the odd ones
        gate = (self.gate[e](x) + bias[0::2]).clamp(max=self.limit)
        up = (self.up[e](x) + bias[1::2]).clamp(min=-self.limit, max=self.limit)
        gated = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))  # the clamped SwiGLU
        return self.down[e](gated) + self.down_proj_bias[e]


def swap_quantized_experts(model: nn.Module, quantized: dict) -> dict:
    """Replace the ``FusedExperts`` whose blocks ``quantized`` holds; returns the quantized
    tensors left for the other modules."""
    groups: dict[str, dict[str, dict[int, object]]] = {}
    rest = {}
    for name, tensor in quantized.items():
        m = _EXPERT_BLOCKS.match(name)
        if m is None:
            rest[name] = tensor
            continue
        prefix, part, e = m.groups()
        groups.setdefault(prefix, {}).setdefault(part, {})[int(e)] = tensor
    for prefix, parts in groups.items():
        dense = model.get_submodule(prefix)
        if not isinstance(dense, FusedExperts):
            raise ValueError(f"quantized expert tensors under {prefix!r} belong to a {type(dense).__name__}, "
                             "which has no quantized counterpart")
        count = dense.gate_up_proj.shape[0]
        if any(sorted(parts.get(p, {})) != list(range(count)) for p in ("gate", "up", "down")):
            raise ValueError(f"{prefix}: the file's expert blocks do not cover gate, up and down of all "
                             f"{count} experts")
        swapped = QuantFusedExperts(dense, *([parts[p][e] for e in range(count)] for p in ("gate", "up", "down")))
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent), child, swapped)
    return rest
