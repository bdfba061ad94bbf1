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
  or a widened float32 tile and PyTorch's GEMM for many (``bf16_weight_linear``);
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

from inferpath.kernels import build, ops
from inferpath.model.batch_invariant import rows_must_be_invariant, rowwise_linear

# bf16 weights with float32 activations (a BF16 file on a CPU without bf16 arithmetic):
# the GEMV widens each weight in the kernel, so a decode step reads 2 bytes a weight; past
# this many rows (per level) a tile of the weight is widened to float32 once and PyTorch's
# GEMM reuses it for every row (``widened_linear``). Measured on AMD EPYC (Zen 4), 1 thread,
# 60 weights of 1536 x 576 (not in cache), ms a matmul GEMV vs tiles: avx2 rows 1: 0.06
# (the float32 GEMV on the widened weights: 0.11), 8: 0.17 vs 0.51, 32: 0.59 vs 0.70, 64:
# 1.13 vs 1.23, 128 to 512: equal; avx512 16: 0.42 vs 0.45, 32: 0.69 vs 1.16, 64: 1.38
# vs 1.28; generic (compiler-vectorised) 2: 0.32 vs 0.21, 4: 0.40 vs 0.26 — kept to 4 rows
# all the same, as the portable bf16 GEMV is, so that small decode batches stay one native
# call (a step's ~360 Python round trips cost more than the difference).
BF16_WEIGHTS_GEMV_MAX_ROWS = {"generic": 4, "avx2": 64, "avxvnni": 64, "avx512": 32}  # avxvnni: avx2's bf16 code


def bf16_weight_kernels(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """(gemv, None, max GEMV rows) for float32 x against a bf16 ``weight`` (contiguous CPU)
    with a float32 ``bias`` or none, in ``linear_kernels``' form; (None, None, 0) where the
    kernel does not serve them."""
    level = build.kernel_level(torch.float32)
    if level is None or not (ops.kernel_ready(torch.bfloat16, weight) and ops.kernel_ready(torch.float32, bias)):
        return None, None, 0
    return build.native_gemv_bf16_weights(), None, BF16_WEIGHTS_GEMV_MAX_ROWS[level]


def bf16_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       kernels: tuple) -> torch.Tensor:
    """x (m, k) float32 @ weight (n, k) bf16 transposed, + bias (n,) float32 or None -> (m, n)
    float32: the widening GEMV (``bf16_weight_kernels``) for a few rows, or any number of
    rows inside ``row_invariant_dispatch``; else ``widened_linear``. The weights widen
    exactly, so this is the float32 product up to the order of the sums."""
    if x.dim() == 2 and ops.gemv_serves(x.shape[0], kernels):
        return ops.run_gemv(kernels[0], x.contiguous(), weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).float()
    if rows_must_be_invariant():  # no kernel here: the PyTorch reference, a row at a time
        return rowwise_linear(x2, weight.float(), bias).reshape(*lead, weight.shape[0])
    return widened_linear(x2, [weight], [bias]).reshape(*lead, weight.shape[0])


def widened_linear(x: torch.Tensor, weights: list[torch.Tensor], biases: list) -> torch.Tensor:
    """x (m, k) float32 against bf16 weights (rows_i, k) side by side, + float32 biases (or
    None each) -> (m, sum of rows) float32: a tile of at most ``quant_ops.DEQUANT_TILE_VALUES`` widened
    to float32 at a time and multiplied by PyTorch's GEMM, as ``ops.dequantized_linear`` does
    for quantized weights."""
    widened = [(w, None) for w in weights]
    return ops.dequantized_linear(x, widened, biases, None)


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
