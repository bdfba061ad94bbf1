"""Quantize float weights into GGUF block formats: on load (``EngineConfig.quantization``)
and into a new GGUF file (``inferpath quantize``).

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized by the ``gguf`` package (llama.cpp's
reference rounding). Q4_K is quantized here: per 32-value sub-block the range [min(0,
x), max(x)] is split in 15 steps; the eight sub-block scales and mins of a 256-value
super-block are then stored as 6-bit multiples of a float16 d and dmin (llama.cpp
searches each sub-block's scale further; this is the plain min/max fit). A weight whose
row length is not a multiple of the format's block (e.g. 896 for Q4_K's 256) takes Q8_0.
The LM head (or the embedding table that serves as it) keeps 8 bits under the 4-bit
formats: the logits read it directly, and llama.cpp's quantizer keeps it at 6 bits or more
(Q6_K) for the same reason (SmolLM2 Q4_0: top-1 agreement with the float model 66% with a
4-bit tied head, benchmarks/llamacpp_compat.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGML_QUANT_VERSION,
    GGMLQuantizationType,
    LlamaFileType,
    quants,
)

from inferpath.weights.quantized import QuantizedTensor

Q = GGMLQuantizationType
# --quantization names (llama.cpp's) -> format
QUANTIZATION_TYPES = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_k": Q.Q4_K}
FALLBACK_TYPE = Q.Q8_0
# general.file_type written by ``inferpath quantize`` (llama.cpp's llama_ftype; Q4_K rows
# that fall back to Q8_0 keep it "mostly Q4_K", as llama.cpp's own fallbacks do)
FILE_TYPES = {Q.Q8_0: LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: LlamaFileType.MOSTLY_Q4_0, Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_S}
# metadata the writer sets itself rather than copying from the source
WRITTEN_KEYS = ("general.architecture", "general.alignment", "general.file_type", "general.quantization_version")


def quantization_type(name: str) -> GGMLQuantizationType:
    """The format of a quantization name (case-insensitive: q4_k, Q4_K); ValueError naming
    the choices otherwise."""
    qtype = QUANTIZATION_TYPES.get(name.lower())
    if qtype is None:
        raise ValueError(f"quantization {name!r} is not supported; use one of {', '.join(QUANTIZATION_TYPES)}")
    return qtype


def type_for(qtype: GGMLQuantizationType, cols: int, is_head: bool = False) -> GGMLQuantizationType:
    """``qtype``, or FALLBACK_TYPE where rows of ``cols`` values do not fill its blocks or
    the weight is the LM head (``is_head``: module doc)."""
    return qtype if cols % GGML_QUANT_SIZES[qtype][0] == 0 and not is_head else FALLBACK_TYPE


def quantize_rows(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """(rows, cols) float -> (rows, row_bytes) uint8 in ``qtype``'s blocks."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.Q4_K:
        return _quantize_q4_k(values)
    return quants.quantize(values, qtype)


def _quantize_q4_k(values: np.ndarray) -> np.ndarray:
    rows, cols = values.shape
    x = values.reshape(-1, 8, 32)  # (super-blocks, sub-blocks, values)
    low = np.minimum(x.min(-1), 0.0)  # (sb, 8)
    scales = (x.max(-1) - low) / 15.0  # (sb, 8): value = scale * q - min
    mins = -low
    d = (scales.max(-1) / 63.0).astype(np.float16)  # (sb,)
    dmin = (mins.max(-1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scales, d32, out=np.zeros_like(scales), where=d32 > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(np.divide(mins, dmin32, out=np.zeros_like(mins), where=dmin32 > 0)), 0, 63).astype(np.uint8)
    step = (d32 * sc)[..., None]  # (sb, 8, 1)
    offset = (dmin32 * mn)[..., None]
    q = np.clip(np.rint(np.divide(x + offset, step, out=np.zeros_like(x), where=step > 0)), 0, 15).astype(np.uint8)
    packed = np.empty((x.shape[0], 144), dtype=np.uint8)
    packed[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    packed[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    # 12 scale bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7
    # (mins); 4-7 in the nibbles of bytes 8-11, their top 2 bits in the top bits of 0-7
    packed[:, 4:8] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 12:16] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    pairs = q.reshape(-1, 4, 2, 32)  # sub-blocks 2i (low nibbles) and 2i+1 (high) share 32 bytes
    packed[:, 16:] = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    return packed.reshape(rows, -1)


def quantize_tensor(values, qtype: GGMLQuantizationType, is_head: bool = False) -> QuantizedTensor:
    """A 2-D float tensor (torch or numpy) as a QuantizedTensor in ``type_for(qtype, cols,
    is_head)``."""
    array = values.detach().float().numpy() if hasattr(values, "detach") else np.asarray(values, np.float32)
    chosen = type_for(qtype, array.shape[1], is_head)
    return QuantizedTensor.from_gguf(quantize_rows(array, chosen), chosen, array.shape)


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """Linear and embedding weights (Hugging Face names): what llama.cpp quantizes. MLA's
    kv_b_proj stays float: its absorbed decode reads W_UK and W_UV per head (model/mla.py)."""
    return (len(shape) == 2 and name.endswith(("proj.weight", "lm_head.weight", "embed_tokens.weight"))
            and not name.endswith("kv_b_proj.weight"))


def quantize_checkpoint(checkpoint, name: str):
    """Quantize ``checkpoint``'s float linear and embedding weights in place to the
    format ``name`` (QUANTIZATION_TYPES); ValueError if it already holds quantized ones."""
    qtype = quantization_type(name)
    if checkpoint.quantized_tensors:
        kinds = sorted({t.type_name for t in checkpoint.quantized_tensors.values()})
        raise ValueError(f"{checkpoint.path} is already quantized ({', '.join(kinds)}); "
                         f"quantization={name!r} applies to float weights only")
    head = "model.embed_tokens.weight" if checkpoint.config.tie_word_embeddings else "lm_head.weight"
    for tensor_name, tensor in list(checkpoint.tensors.items()):
        if is_quantizable(tensor_name, tuple(tensor.shape)):
            checkpoint.tensors[tensor_name] = quantize_tensor(tensor, qtype, is_head=tensor_name == head)
    return checkpoint


def write_quantized_gguf(source: Path, target: Path, type_name: str) -> dict[str, str]:
    """Copy a GGUF file with its float 2-D tensors quantized to ``type_name`` (e.g. "Q4_K");
    metadata and the other tensors unchanged. Returns tensor name -> written type."""
    from gguf import GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    from inferpath.weights.gguf import field, open_gguf

    qtype = quantization_type(type_name)
    reader = open_gguf(source)
    writer = GGUFWriter(target, arch=str(field(reader, "general.architecture")))
    # NOTE: the writer pads tensor data to its own alignment: a source's general.alignment
    # must become the writer's, not a copied key that points readers at the wrong offsets
    if field(reader, "general.alignment") is not None:
        writer.add_custom_alignment(int(field(reader, "general.alignment")))
    writer.add_file_type(int(FILE_TYPES[qtype]))  # what the file now mostly holds (llama.cpp's ftype)
    writer.add_quantization_version(GGML_QUANT_VERSION)  # block layouts of ggml's version 2
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in WRITTEN_KEYS:
            continue
        value_type = GGUFValueType(int(f.types[0]))
        sub_type = GGUFValueType(int(f.types[-1])) if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), value_type, sub_type=sub_type)
    written = {}
    float_types = (Q.F32, Q.F16, Q.BF16)
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"  # tied: the table is the head
    for t in reader.tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))  # (rows, cols)
        if len(shape) == 2 and t.tensor_type in float_types and not t.name.endswith("norm.weight"):
            chosen = type_for(qtype, shape[1], is_head=t.name == head)
            data = quantize_rows(dequantize(t.data, t.tensor_type).reshape(shape), chosen)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=chosen)
        else:
            chosen = t.tensor_type
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=chosen)
        written[t.name] = chosen.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written
