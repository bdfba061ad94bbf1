"""``nn.Linear`` that picks the faster CPU kernel for the shape at hand, applied from outside.

``accelerate_linears(model)`` turns every ``nn.Linear`` of a built model into a
``CPULinear`` (a subclass: module names, ``state_dict`` keys, forward hooks and
``isinstance`` checks stay as they were). Its forward dispatches on dtype and rows:

- float32 or bf16 on CPU with 1 to 4 rows (a decode step of up to four sequences): the
  native ``gemv`` kernel, which reads each weight once at close to memory bandwidth;
- anything else (more rows, other dtypes or devices): ``F.linear``, as before.

NOTE: tried and left out: reordering bf16 weights once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) for batched steps. It doubles the weights'
memory (the plain copy stays for the GEMV, the embedding and ``state_dict``) and a
batch-32 engine step measured no faster (100 vs 103 ms, interleaved A/B on SmolLM2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.kernels import build
from inferpath.kernels.build import MAX_ROWS, run_gemv


class CPULinear(nn.Linear):
    """An ``nn.Linear`` whose forward chooses a kernel by dtype and row count (module doc)."""

    def prepare(self) -> "CPULinear":
        """Decide the kernel for the current weight (call again after replacing it)."""
        weight, bias = self.weight, self.bias
        fits = (weight.device.type == "cpu" and weight.is_contiguous()
                and (bias is None or (bias.dtype == weight.dtype and bias.is_contiguous())))
        self._gemv = build.native_gemv(weight.dtype) if fits else None
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in_features) -> (num_tokens, out_features)
        if (self._gemv is not None and x.dim() == 2 and x.shape[0] <= MAX_ROWS
                and x.dtype == self.weight.dtype):
            return run_gemv(self._gemv, x.contiguous(), self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def accelerate_linears(model: nn.Module) -> int:
    """Make every ``nn.Linear`` in ``model`` a prepared ``CPULinear``; returns how many.

    Idempotent. Call after the weights are loaded (and after tensor-parallel sharding).
    """
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if not isinstance(module, CPULinear):
                module.__class__ = CPULinear
            module.prepare()
            count += 1
    return count
