"""bf16 weights with float32 activations: a BF16 file (or bf16 checkpoint) on a CPU
without bf16 arithmetic (AVX2 machines, AVX-512 without AVX512-BF16), applied from outside
the model like quantized.py.

Converting such weights to float32 at load doubles what a decode step reads (decode is
bound by reading the weights) and what the process holds. Instead
``build_bf16_weight_model`` keeps every ``nn.Linear`` and ``nn.Embedding`` matrix the
checkpoint holds in bfloat16 as it lies (a BF16 GGUF's: views of the mapped file) and
loads the rest — norms, biases, and so the activations and the KV cache — in float32:

- the linears (``CPULinear`` once ``accelerate`` has run, and the fused Q/K/V and gate/up
  groups) meet float32 x: a GEMV that widens each weight in the kernel (a 16-bit shift,
  exact) and sums in float32 for a few rows (csrc/*/gemv.c ``gemv_columns_bf16_weights``),
  or a widened float32 tile and PyTorch's GEMM for many (``ops.bf16_weight_linear``);
  a decode step's layers stay one native call (decode_stack.py);
- the embedding (``WideningEmbedding``) looks up bf16 rows and widens them; a tied LM
  head shares its table.

Every weight widens exactly, so the model equals the float32 model built from the same
file up to the order of float32 sums. ``accelerate`` must run on the model (build_for_engine
does): a plain ``nn.Linear`` refuses to multiply float32 x by bf16 weights.
"""

from __future__ import annotations

import torch
from torch import nn


class WideningEmbedding(nn.Embedding):
    """Row lookup in a bfloat16 table, the rows widened to float32 (exactly)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (num_tokens,) -> (num_tokens, embedding_dim) float32
        return super().forward(input_ids).float()


def holds_bf16_matrices(checkpoint) -> bool:
    """Whether ``checkpoint`` (loaded with ``keep_bf16``) kept any matrix in bfloat16."""
    return any(t.dtype == torch.bfloat16 and t.dim() == 2 for t in checkpoint.tensors.values()
               if isinstance(t, torch.Tensor))


def build_bf16_weight_model(checkpoint):
    """A float32 Transformer whose ``nn.Linear`` / ``nn.Embedding`` weights are the
    checkpoint's bfloat16 matrices themselves (no copy); every other tensor is converted to
    float32 by ``Transformer.load_weights``, which names any missing or misshapen one."""
    from inferpath.model import Transformer

    model = Transformer(checkpoint.config, torch.float32)
    for name, tensor in checkpoint.tensors.items():
        module_name, _, kind = name.rpartition(".")
        if tensor.dtype != torch.bfloat16 or tensor.dim() != 2 or kind != "weight":
            continue
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue  # load_weights names the tensor the model does not have
        if type(module) in (nn.Linear, nn.Embedding) and tuple(module.weight.shape) == tuple(tensor.shape):
            module.weight.data = tensor  # a tied LM head shares this Parameter: bf16 too
            if type(module) is nn.Embedding:
                module.__class__ = WideningEmbedding
    model.load_weights(checkpoint.tensors)  # the bf16 ones: already in place, kept as they are
    return model.eval()
