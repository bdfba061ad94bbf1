"""Modules over GGUF block-quantized weights, applied from outside the model.

``build_quantized_model(checkpoint)`` builds the plain ``Transformer`` and swaps, by
weight name, each ``nn.Linear`` whose weight is a ``QuantizedTensor`` for a
``QuantLinear`` and a quantized ``nn.Embedding`` for a ``QuantEmbedding`` (a tied LM head
shares the embedding's blocks); the model file knows nothing of them. The weights stay
in the memory-mapped file's block layout: nothing is dequantized at load, and a decode
step reads the file's bytes (Q4_1 SmolLM2: ~97 MB instead of 538 MB of float32).

- ``QuantLinear``: float32 activations, quantized per 32 values to int8 (plus an int8
  residual) inside the kernel, integer dot products against the weight blocks
  (csrc/quant: matmul.c's row kernel, wide.c's 8-row tiles on AVX2, gemm.c's packed
  panels for 4+ rows with AVX-512 VNNI) for up to
  ``quant_ops.QUANT_MATMUL_MAX_ROWS[level]`` rows; more rows dequantize a weight tile at a time
  and reuse it for every row through PyTorch's GEMM.
- ``QuantEmbedding``: the rows of the looked-up tokens, dequantized.

Without the native kernels both fall back to the ``gguf`` package's dequantizer (correct,
slow); the engine does not choose this path there.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.kernels import build, ops
from inferpath.kernels.repacked import R8_ROWS, RepackedTensor, kernel_type, repack, repackable
from inferpath.weights.quantized import QuantizedTensor


class QuantLinear(nn.Module):
    """y = x @ W^T + b with W a ``QuantizedTensor`` (out_features, in_features); output
    in x's dtype."""

    def __init__(self, weight: QuantizedTensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = weight
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._matmul, self._dequantize = build.native_quant_matmul(), build.native_quant_dequantize()

    def extra_repr(self) -> str:
        layout = " repacked by 8 rows" if getattr(self.qweight, "repacked", False) else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.type_name}{layout}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, in_features) -> (num_tokens, out_features)
        lead, dtype = x.shape[:-1], x.dtype
        x32 = x.reshape(-1, self.in_features).float().contiguous()
        bias = None if self.bias is None else self.bias.float()
        if self._matmul is None:
            out = nn.functional.linear(x32, self.qweight.dequantize(), bias)
        else:
            out = ops.quantized_linear(x32, self.qweight.data, kernel_type(self.qweight), self.in_features,
                                       bias, self._matmul, self._dequantize)
        return out.to(dtype).reshape(*lead, self.out_features)

    def forward_rows(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Outputs start..stop-1 only, (num_tokens, stop - start): the weight's rows for them
        read alone (a repacked weight's whole groups of eight holding them, then the slice)."""
        if not 0 <= start < stop <= self.out_features:
            raise IndexError(f"rows {start}..{stop} are outside the {self.out_features} rows of the weight")
        grouped = getattr(self.qweight, "repacked", False)
        lo, hi = (start // 8 * 8, min(-(-stop // 8) * 8, self.out_features)) if grouped else (start, stop)
        x32 = x.reshape(-1, self.in_features).float().contiguous()
        bias = None if self.bias is None else self.bias[lo:hi].float()
        if self._matmul is None:
            out = nn.functional.linear(x32, self.qweight.dequantize()[lo:hi], bias)
        else:
            out = ops.quantized_linear(x32, self.qweight.data[lo:hi], kernel_type(self.qweight), self.in_features,
                                       bias, self._matmul, self._dequantize)
        return out[:, start - lo:stop - lo].to(x.dtype)


class QuantEmbedding(nn.Module):
    """Row lookup in a ``QuantizedTensor`` (num_embeddings, embedding_dim), dequantized to
    ``dtype``; or in a ``RepackedTensor`` (a table a tied LM head shares, repacked with it):
    each id's group of eight rows dequantized (the file's values to the bit) and its row kept."""

    def __init__(self, weight: QuantizedTensor | RepackedTensor, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.qweight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self._dequantize = build.native_quant_dequantize()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qweight.type_name}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: (num_tokens,) -> (num_tokens, embedding_dim)
        if isinstance(self.qweight, RepackedTensor):
            return self._grouped_rows(input_ids.reshape(-1)).to(self.dtype).reshape(*input_ids.shape, self.embedding_dim)
        rows = self.qweight.data.index_select(0, input_ids.reshape(-1))  # (num_tokens, row_bytes)
        if self._dequantize is None:
            values = QuantizedTensor(rows, self.qweight.qtype, (rows.shape[0], self.embedding_dim)).dequantize()
        else:
            values = ops.run_dequantize(self._dequantize, rows, int(self.qweight.qtype), self.embedding_dim)
        return values.to(self.dtype).reshape(*input_ids.shape, self.embedding_dim)

    def _grouped_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(n,) ids -> (n, embedding_dim) float32 from the repacked groups holding them."""
        data, n = self.qweight.data, ids.shape[0]
        if n == 1:  # a decode step's id: its group is a slice of rows (no gather)
            i = int(ids[0])
            if not 0 <= i < self.num_embeddings:
                raise IndexError(f"token id {i} is out of range for an embedding of {self.num_embeddings} rows")
            first = i - i % R8_ROWS
            values = self._dequantized(data[first:first + R8_ROWS], R8_ROWS)
            return values[i - first:i - first + 1]
        groups = data.view(-1, R8_ROWS * data.shape[1]).index_select(0, ids // R8_ROWS)  # (n, a group's bytes)
        values = self._dequantized(groups.view(n * R8_ROWS, data.shape[1]), n * R8_ROWS)
        return values.view(n, R8_ROWS, self.embedding_dim)[torch.arange(n), ids % R8_ROWS]

    def _dequantized(self, groups: torch.Tensor, rows: int) -> torch.Tensor:
        """Whole repacked groups (rows, row_bytes) -> (rows, embedding_dim) float32."""
        if self._dequantize is None:
            return RepackedTensor(groups, self.qweight.qtype, (rows, self.embedding_dim)).dequantize()
        return ops.run_dequantize(self._dequantize, groups, self.qweight.kernel_type, self.embedding_dim)


def quantized_kernels_available() -> bool:
    """Whether the fused quantized kernels run here (else quantized weights are dequantized)."""
    return build.native_quant_matmul() is not None


def build_quantized_model(checkpoint, dtype: torch.dtype = torch.float32, repack_formats: tuple[str, ...] = ()):
    """A Transformer whose quantized weights (``checkpoint.quantized_tensors``) stay in
    their blocks, under ``QuantLinear``/``QuantEmbedding``; float tensors load as usual
    (``Transformer.load_weights``, which names any missing or misshapen one).

    ``repack_formats`` (a ``WeightPlan.repacked``): the linear weights of these formats are
    repacked into groups of eight rows (kernels/repacked.py) where r8.c takes their shape,
    the mapped pages under them dropped; so is an embedding's table that a tied LM head
    shares (once, for both: the lookup dequantizes an id's group); an embedding's own table
    stays as laid out, its rows looked up in place."""
    from inferpath.model import Transformer

    from inferpath.kernels.quant_experts import swap_quantized_experts  # gpt-oss's stacked experts

    model = Transformer(checkpoint.config, dtype)
    quantized = checkpoint.quantized_tensors
    tied = checkpoint.config.tie_word_embeddings and "model.embed_tokens.weight" in quantized
    repacked: dict[str, RepackedTensor] = {}

    def packed(name: str, weight):
        if weight.type_name in repack_formats and repackable(weight):
            if name not in repacked:  # the tied table: once, for the lookup and the head
                repacked[name] = repack(weight)
            return repacked[name]
        return weight

    for name, weight in swap_quantized_experts(model, quantized).items():
        module_name = name.removesuffix(".weight")
        module = model.get_submodule(module_name)
        if isinstance(module, nn.Embedding):
            replacement = QuantEmbedding(packed(name, weight) if tied and name == "model.embed_tokens.weight" else weight,
                                         dtype)
        elif isinstance(module, nn.Linear):
            replacement = QuantLinear(packed(name, weight), module.bias)
        else:
            raise ValueError(f"quantized tensor {name!r} belongs to a {type(module).__name__}, "
                             "which has no quantized counterpart")
        _replace(model, module_name, replacement)
    if tied:
        model.lm_head = QuantLinear(packed("model.embed_tokens.weight", quantized["model.embed_tokens.weight"]))
    model.load_weights({name: t for name, t in checkpoint.tensors.items() if name not in quantized})
    return model.eval()


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights the model holds, quantized ones at their block size."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, (QuantLinear, QuantEmbedding)) and id(module.qweight) not in seen:
            seen.add(id(module.qweight))
            total += module.qweight.nbytes
    for p in {id(p): p for p in model.parameters()}.values():
        total += p.numel() * p.element_size()
    return total
