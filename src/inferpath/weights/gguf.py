"""GGUF reader: llama.cpp's single-file format → ModelConfig and Hugging Face-named tensors.

The header is read (and checked) once per file into a ``GGUFIndex`` (gguf_index.py,
cached across processes); the file is memory-mapped copy-on-write and each tensor is kept
in its block layout (``QuantizedTensor``), or, a float matrix, viewed by PyTorch (cast to
the compute dtype only if it differs), or else dequantized by ``gguf.quants.dequantize``
to float32 and cast; all renamed (names.py). Nothing is unpickled.

NOTE: llama.cpp's converter permutes the rows of Q and K (and their biases) of
Llama-architecture models so that its RoPE can rotate adjacent pairs; Hugging Face's
rotate-half RoPE pairs row j with row j + head_dim/2. ``unpermute_rows`` undoes it, so a
GGUF file and the Hugging Face checkpoint it came from give the same tensors. Qwen2 files
are converted without the permutation and are left alone.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from inferpath.config import ConfigError, ModelConfig
from inferpath.weights.errors import WeightsError
from inferpath.weights.gguf_arch import GGUF_ARCHITECTURES, GGUFArchitecture, is_norm
from inferpath.weights.gguf_index import GGUFIndex, read_gguf_index
from inferpath.weights.gguf_keys import check_metadata_keys
from inferpath.weights.names import IGNORED_GGUF_TENSORS, hf_name, split_fused, stacked_expert_names
from inferpath.weights.quantized import QUANTIZED_TYPES, QuantizedTensor
from inferpath.weights.rope_freqs import rope_scaling_from_freqs

Q = GGMLQuantizationType
SUPPORTED_TENSOR_TYPES = frozenset({
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K,
    Q.MXFP4,  # families2: gpt-oss's experts (kernels/csrc/quant/mxfp4.c)
})
# float types PyTorch holds as they are stored
_TORCH_FLOATS = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}


class _PlainViewGGUFReader(GGUFReader):
    """GGUFReader over plain ndarray views of the mapped file (``open_gguf``)."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        # NOTE: slices of an np.memmap are memmaps, whose bookkeeping dominated the parse of
        # a 151k-token vocabulary (seconds); a plain ndarray view maps the same pages.
        if type(self.data) is np.memmap:
            self.data = self.data.view(np.ndarray)
        return super()._get(offset, dtype, count, override_order)


def open_gguf(path: Path) -> GGUFReader:
    """A ``gguf.GGUFReader`` over a file that passed gguf_check (for what needs the file's
    own value types, such as rewriting it: weights/quantize.py). Loading reads the cheaper
    ``read_gguf_index`` instead."""
    read_gguf_index(path)  # checked, before GGUFReader trusts the counts
    try:
        return _PlainViewGGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise WeightsError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); "
            "it may be truncated or corrupt, download it again"
        ) from None


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value of a GGUFReader (scalar, string or list), or ``default``."""
    f = reader.get_field(key)
    return default if f is None else f.contents()


def eos_token_ids(index: GGUFIndex) -> list[int]:
    """End-of-sequence ids: eos, then eot and eom (end of turn/message) when present."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = index.field(f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def architecture_of(index: GGUFIndex, path: Path) -> GGUFArchitecture:
    """The entry (gguf_arch.py) of the file's ``general.architecture``; WeightsError naming
    the supported ones for any other."""
    arch = index.field("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise WeightsError(
            f"{path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    return GGUF_ARCHITECTURES[arch]


def config_from_gguf(index: GGUFIndex, path: Path) -> ModelConfig:
    """ModelConfig from GGUF metadata (``read_gguf_index``), via the equivalent Hugging
    Face config dict."""
    arch = index.field("general.architecture")
    entry = architecture_of(index, path)
    check_metadata_keys(index.metadata, arch, path)
    tensor_shapes = {t.name: t.shape for t in index.tensors}

    def meta(key: str, default: Any = None) -> Any:
        return index.field(f"{arch}.{key}", default)

    def required(key: str) -> int:
        if (value := meta(key)) is None:
            raise WeightsError(f"{path}: GGUF metadata lacks '{arch}.{key}', which the config needs")
        return int(value)

    num_experts = int(meta("expert_count", 0) or 0)
    num_heads = required("attention.head_count")
    num_kv_heads = meta("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # per-layer list in some files; uniform here
        num_kv_heads = num_kv_heads[0]
    hidden = required("embedding_length")
    head_dim = int(meta("attention.key_length") or hidden // num_heads)
    rope_theta = float(meta("rope.freq_base", 10000.0))
    rope_scaling = _rope_scaling(meta)
    if rope_scaling is None and (freqs := index.tensor("rope_freqs.weight")) is not None:
        values = dequantize(index.array(index.map_data(), freqs), freqs.qtype)
        rope_scaling = rope_scaling_from_freqs(values, rope_theta, head_dim, path)
    vocab = meta("vocab_size") or tensor_shapes.get("token_embd.weight", (None,))[0]
    if vocab is None:
        vocab = len(index.field("tokenizer.ggml.tokens", []))
    window = meta("attention.sliding_window")
    model_type = "mixtral" if num_experts and entry.model_type in ("llama", "mistral") else entry.model_type
    if model_type == "llama" and window is not None:
        model_type = "mistral"  # llama.cpp stores Mistral 7B as llama with a window
    hf: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta("expert_feed_forward_length") or required("feed_forward_length")),
        "num_hidden_layers": required("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(num_kv_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(meta("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_shapes,
    }
    # biases are told by the tensors present, as llama.cpp itself does
    has_bias = {part: f"blk.0.{part}.bias" in tensor_shapes for part in ("attn_q", "attn_output", "ffn_up")}
    if model_type == "llama":
        if has_bias["attn_q"] or has_bias["attn_output"]:
            hf["attention_bias"] = True
        if has_bias["ffn_up"]:
            hf["mlp_bias"] = True
    if model_type in ("mistral", "mixtral") and window is not None:
        hf["sliding_window"] = int(window)
    if entry.config_fields is not None:
        hf.update(entry.config_fields(meta, hf, tensor_shapes, path))
        if window is not None and "sliding_window" not in hf:  # read by no rule of this family
            raise WeightsError(f"{path}: GGUF metadata {arch}.attention.sliding_window = {window} is not "
                               f"implemented for {arch!r} files (no sliding-window layers); refusing "
                               "rather than attending to the whole context")
    if model_type == "mixtral":
        hf.update(num_local_experts=num_experts, num_experts_per_tok=int(meta("expert_used_count", 0) or 0))
    try:
        return ModelConfig.from_hf_config(hf, name=str(index.field("general.name", path.stem)))
    except ConfigError as exc:
        raise WeightsError(f"{path}: GGUF metadata gives an invalid config: {exc}") from None


def _rope_scaling(meta: Any) -> dict[str, Any] | None:
    kind = meta("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": float(meta("rope.scaling.factor", 1.0))}
    if (orig := meta("rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


def unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's Q/K permutation of a weight (rows, cols) or bias (rows,).

    Within each head llama.cpp stores the rows as interleaved pairs (0, d/2, 1, d/2+1, …);
    Hugging Face stores the first half then the second half.
    """
    half = rows.shape[0] // num_heads // 2
    per_head = rows.reshape(num_heads, half, 2, *rows.shape[1:])  # (heads, d/2, 2, …)
    return per_head.swapaxes(1, 2).reshape(rows.shape)  # (heads, 2, d/2, …) flattened


def read_gguf(path: Path, dtype: torch.dtype, progress: bool = False, keep_quantized: bool = False,
              keep_bf16: bool = False) -> tuple[ModelConfig, dict[str, torch.Tensor | QuantizedTensor], list[int]]:
    """Config, Hugging Face-named tensors in ``dtype``, and EOS ids of one GGUF file.

    With ``keep_quantized``, 2-D tensors in a block format the kernels read
    (``QUANTIZED_TYPES``) stay as ``QuantizedTensor`` views of the mapped file (Q and K
    rows of permuted architectures are copied into Hugging Face order); the rest are
    dequantized to ``dtype`` as usual. With ``keep_bf16``, BF16 matrices stay bfloat16
    views of the mapped file (reordered the same way).
    """
    index = read_gguf_index(path)
    config = config_from_gguf(index, path)
    data = index.map_data()
    entry = architecture_of(index, path)
    permuted = entry.permuted_qk
    heads_of = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    tensors: dict[str, torch.Tensor] = {}
    infos = index.tensors
    if progress:
        from tqdm import tqdm

        infos = tqdm(infos, desc=f"loading {path.name}", unit="tensor")
    for t in infos:
        if IGNORED_GGUF_TENSORS.match(t.name) or (entry.extra_layers_ignored and _layer_of(t.name) >= config.num_layers):
            continue
        if t.qtype not in SUPPORTED_TENSOR_TYPES:
            raise WeightsError(
                f"{path}: tensor {t.name!r} is stored as {t.qtype.name}, which inferpath "
                f"does not dequantize; supported: {', '.join(q.name for q in SUPPORTED_TENSOR_TYPES)}"
            )
        shape = t.shape  # numpy order: (rows, cols)
        parts = t.name.split(".")
        kind = parts[2] if parts[0] == "blk" and len(parts) > 2 else ""  # a malformed name: its own error below
        if permuted and kind in heads_of and shape[0] % (2 * heads_of[kind]):
            raise WeightsError(f"{path}: tensor {t.name!r} has {shape[0]} rows, not a whole number of "
                               f"row pairs for its {heads_of[kind]} heads; the file is inconsistent")
        if keep_quantized and t.qtype in QUANTIZED_TYPES and len(shape) == 2 and kind not in entry.float_kinds:
            blocks = index.array(data, t)  # (rows, row_bytes)
            if permuted and kind in heads_of:
                blocks = _rows_in_order(blocks, unpermute_rows(np.arange(shape[0]), heads_of[kind]))
            tensors[_hf_name_or_raise(t.name, entry, config, path)] = QuantizedTensor.from_gguf(blocks, t.qtype, shape)
            continue
        if keep_quantized and t.qtype in QUANTIZED_TYPES and len(shape) == 3 and entry.regroup is not None:
            blocks = index.array(data, t)  # (num_experts, rows, row_bytes): each expert's blocks, regrouped below
            tensors[_hf_name_or_raise(t.name, entry, config, path)] = tuple(
                QuantizedTensor.from_gguf(blocks[e], t.qtype, shape[1:]) for e in range(shape[0]))
            continue
        if t.qtype in _TORCH_FLOATS and len(shape) == 2:  # matrices: no numpy dequantization
            rows = index.array(data, t)  # F32/F16 values, BF16 bytes (rows, 2 * cols)
            if permuted and kind in heads_of:
                rows = _rows_in_order(rows, unpermute_rows(np.arange(shape[0]), heads_of[kind]))
            matrix = _float_matrix(rows, t.qtype, torch.bfloat16 if keep_bf16 and t.qtype == Q.BF16 else dtype)
            if not _shares_memory(matrix, rows):  # converted: its bytes in the map are read for good
                _release_pages(data, t.offset, t.nbytes)
            tensors[_hf_name_or_raise(t.name, entry, config, path)] = matrix
            continue
        try:
            values = dequantize(index.array(data, t), t.qtype).reshape(shape)
        except ValueError as exc:
            raise WeightsError(f"{path}: tensor {t.name!r} (shape {shape}, "
                               f"{t.qtype.name}) is corrupt: {exc}") from None
        if permuted and kind in heads_of:
            values = unpermute_rows(values, heads_of[kind])
        if entry.norm_shift and is_norm(t.name):  # stored as w + shift (Gemma's 1 + w norms)
            values = values.astype(np.float32) - np.float32(entry.norm_shift)
        if entry.regroup is None and (names := stacked_expert_names(t.name, shape[0], entry.routed_experts)) is not None:
            for name, expert in zip(names, values):  # values: (num_experts, rows, cols)
                tensors[name] = _to_torch(expert, dtype)
            continue
        tensors[_hf_name_or_raise(t.name, entry, config, path)] = _to_torch(values, dtype)
    if entry.combine is not None:  # the converter's split or rewritten tensors, back in HF form
        tensors = entry.combine(tensors, config)
    if entry.regroup is not None:  # stacked experts fused as the family's checkpoints store them
        tensors = entry.regroup(tensors, config)
    return config, split_fused(tensors, config, _take_rows), eos_token_ids(index)


def _layer_of(gguf_tensor: str) -> int:
    """N of a ``blk.N.`` tensor, -1 for a global one."""
    parts = gguf_tensor.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1


def _take_rows(tensor: torch.Tensor | QuantizedTensor, start: int, end: int) -> torch.Tensor | QuantizedTensor:
    """Rows start..end-1 of a float matrix or of a block-format one (whole rows of blocks)."""
    if isinstance(tensor, QuantizedTensor):
        return QuantizedTensor(tensor.data[start:end], tensor.qtype, (end - start, tensor.shape[1]))
    return tensor[start:end]


def _float_matrix(rows: np.ndarray, qtype: GGMLQuantizationType, dtype: torch.dtype) -> torch.Tensor:
    """A float matrix of the mapped file in ``dtype``: the map itself when that is the
    file's type, else converted by PyTorch in one pass (F16 -> bf16 without a float32
    copy; every conversion exact or rounded once, as through float32)."""
    if not (rows.flags.writeable and rows.flags.aligned):  # torch would write to a read-only map
        rows = rows.copy()
    tensor = torch.from_numpy(rows)
    return (tensor.view(torch.bfloat16) if qtype == Q.BF16 else tensor).to(dtype)


def _shares_memory(tensor: torch.Tensor, rows: np.ndarray) -> bool:
    return tensor.data_ptr() == rows.ctypes.data


def _release_pages(data: np.ndarray, start: int, nbytes: int) -> None:
    """Drop the whole pages of the map in [start, start + nbytes) from this process's
    memory (madvise DONTNEED): a converted matrix's bytes are never read again, and as
    pages of a mapping they would stay resident beside the conversion (a BF16 file read
    in float32 peaked at the file plus twice its size). Pages shared with a neighbouring
    tensor stay; a page dropped from the copy-on-write map reads as the file again if
    touched. Without the map's ``mmap`` object (numpy's ``_mmap``), nothing is dropped."""
    mapped = getattr(data.base, "_mmap", None)
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED") and end > first:  # (no madvise on Windows)
        mapped.madvise(mmap.MADV_DONTNEED, first, end - first)


def _rows_in_order(rows: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``rows[order]`` (whole rows of blocks): in place where the mapping is writable (copy-
    on-write: just these pages become the process's own, where a copy would hold both), else
    a copy. NOTE: ask numpy, not torch, whether it is writable: torch does not know."""
    if not rows.flags.writeable:
        return rows[order]
    rows[:] = rows[order]
    return rows


def _hf_name_or_raise(gguf_tensor: str, entry: GGUFArchitecture, config: ModelConfig, path: Path) -> str:
    layer, _, rest = gguf_tensor.removeprefix("blk.").partition(".")
    if gguf_tensor.startswith("blk.") and rest in entry.exact_renames:
        return f"model.layers.{layer}.{entry.exact_renames[rest]}"
    name = hf_name(gguf_tensor, entry.renames)
    if name is None:
        raise WeightsError(
            f"{path}: tensor {gguf_tensor!r} has no Hugging Face counterpart for a "
            f"{config.architecture} model; this GGUF variant is not supported"
        )
    return name


def _to_torch(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    # F32 tensors come back as views of the memory map: copy those read-only or misaligned,
    # and vectors (norms, biases: small), so that a file whose matrices were all converted
    # (a BF16 file read in float32) leaves no view that keeps the whole map resident
    values = np.ascontiguousarray(values, dtype=np.float32)
    if not (values.flags.writeable and values.flags.aligned) or values.ndim == 1:
        values = values.copy()
    return torch.from_numpy(values).to(dtype)
