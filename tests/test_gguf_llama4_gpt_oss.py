"""Llama 4 text and gpt-oss from GGUF files made by llama.cpp's own converter, and gpt-oss
with MXFP4 experts.

As test_gguf_convert.py: a tiny random model saved by transformers (hidden 64, Llama-3
tokenizer), converted by ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36) to F32, F16
and Q8_0, loaded by inferpath, its logits over a chunked prefill and 8 decode steps against
transformers' on the directory with the weights rounded as the file stores them (experts:
along their input dimension, as the converter's rows run). Llama 4's file carries no key
for NoPE layers, chunks, temperature or QK-norm (llama.cpp fixes them: every 4th layer
NoPE, chunks of 8192, ...), so its tiny model uses those values.

MXFP4: the converter writes MXFP4 only from checkpoints already in MXFP4 (gpt-oss's
``*_blocks`` / ``*_scales`` tensors), which transformers cannot make offline on CPU; so
the F32 file is rewritten by the ``gguf`` package's writer with its experts quantized by
``gguf.quants.quantize(.., MXFP4)``, and compared with transformers on the same MXFP4-rounded
weights: dequantized at load (1e-4), and read in place by the kernel (within 1e-3).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_convert import LLAMA3_VOCAB_SIZE, convert_all, save_tiny
from test_gguf_convert import _compare, _converted_file

from inferpath.model import build_model
from inferpath.weights import load_checkpoint

import gguf
import transformers  # test-only reference

FORMATS = ("f32", "f16", "q8_0")
TOLERANCE = 1e-4
BPE = {"bos_token_id": 128_000, "eos_token_id": 128_001}
BASE = {"vocab_size": LLAMA3_VOCAB_SIZE, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "initializer_range": 0.1, "attn_implementation": "eager"}
FAMILIES = {
    # llama.cpp's fixed Llama 4 settings; MoE every 2nd layer, the 4th layer NoPE
    "llama4": lambda: transformers.Llama4TextConfig(**BASE, num_hidden_layers=4, head_dim=16, intermediate_size=32,
                                                    intermediate_size_mlp=128, num_local_experts=4,
                                                    interleave_moe_layer_step=2, **BPE),
    "gpt-oss": lambda: transformers.GptOssConfig(**BASE, num_hidden_layers=3, head_dim=16, intermediate_size=64,
                                                 num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                                                 **BPE),  # swiglu_limit 7: llama.cpp's, the file has no key
}
_F32 = ("router.weight",)  # the converter keeps routers F32
_EXPERT_PARTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _round(values: np.ndarray, qtype) -> np.ndarray:
    return gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype).reshape(values.shape)


@torch.no_grad()
def rounded(model: torch.nn.Module, outtype: str, expert_qtype=None) -> torch.nn.Module:
    """A copy of ``model`` with its matrices rounded as the file stores them: F16, or Q8_0
    along rows of whole blocks (F16 otherwise); stacked experts (E, in, out) along ``in``;
    ``expert_qtype`` (MXFP4) for the experts alone, the rest left float32."""
    out = copy.deepcopy(model)
    for name, param in out.named_parameters():
        if param.ndim < 2 or name.endswith(_F32) or (outtype == "f32" and expert_qtype is None):
            continue
        values = param.detach().float().numpy()
        stacked = param.ndim == 3
        if expert_qtype is not None:
            if not stacked:
                continue
            values = _round(np.ascontiguousarray(values.transpose(0, 2, 1)), expert_qtype).transpose(0, 2, 1)
        elif stacked:  # rows of the file are the (E, out, in) transpose
            rows = np.ascontiguousarray(values.transpose(0, 2, 1))
            q = gguf.GGMLQuantizationType.Q8_0
            rows = _round(rows, q) if outtype == "q8_0" and rows.shape[-1] % 32 == 0 else rows.astype(np.float16)
            values = rows.astype(np.float32).transpose(0, 2, 1)
        elif outtype == "q8_0" and values.shape[-1] % 32 == 0:
            values = _round(values, gguf.GGMLQuantizationType.Q8_0)
        else:
            values = values.astype(np.float16).astype(np.float32)
        param.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    return out


def mxfp4_file(source: Path, target: Path) -> Path:
    """``source`` (an F32 file) rewritten with its expert matrices in MXFP4 blocks."""
    reader = gguf.GGUFReader(source)
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for t in reader.tensors:
        values = np.asarray(t.data)
        if t.name.endswith(_EXPERT_PARTS):
            blocks = gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), gguf.GGMLQuantizationType.MXFP4)
            writer.add_tensor(t.name, blocks, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(t.name, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-cpp-converted-l4-oss")
    models, jobs = {}, []
    for family, make_config in FAMILIES.items():
        models[family] = save_tiny(make_config(), root / family, "llama3")
        jobs += [(root / family, fmt, root / f"{family}-{fmt}.gguf") for fmt in FORMATS]
    convert_all(jobs)
    return root, models


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_gguf_logits_match_transformers(converted, family, fmt):
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, family, fmt))
    assert checkpoint.config.architecture == models[family].config.model_type
    reference = rounded(models[family], fmt)
    _compare(reference, build_model(checkpoint), LLAMA3_VOCAB_SIZE, TOLERANCE)


@torch.inference_mode()
def test_gpt_oss_mxfp4_experts_dequantized_at_load_match_transformers(converted):
    root, models = converted
    path = mxfp4_file(_converted_file(root, "gpt-oss", "f32"), root / "gpt-oss-mxfp4.gguf")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    reference = rounded(models["gpt-oss"], "f32", expert_qtype=gguf.GGMLQuantizationType.MXFP4)
    _compare(reference, build_model(load_checkpoint(path)), LLAMA3_VOCAB_SIZE, TOLERANCE)


IN_PLACE_TOLERANCE = 1e-3  # the kernels round x to int8 per 32 values (test_gguf_convert.py: the same bound)


def _in_place(path: Path):
    from inferpath.kernels import accelerate
    from inferpath.kernels.quantized import build_quantized_model

    checkpoint = load_checkpoint(path, keep_quantized=True)
    assert checkpoint.quantized_tensors  # blocks kept
    model = build_quantized_model(checkpoint, torch.float32)
    accelerate(model)
    return model.eval()


@torch.inference_mode()
def test_gpt_oss_mxfp4_experts_run_in_place(converted):
    from inferpath.kernels.quant_experts import QuantFusedExperts

    root, models = converted
    path = root / "gpt-oss-mxfp4.gguf"
    if not path.is_file():
        mxfp4_file(_converted_file(root, "gpt-oss", "f32"), path)
    model = _in_place(path)
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantFusedExperts) and experts.gate[0].qweight.type_name == "MXFP4"
    reference = rounded(models["gpt-oss"], "f32", expert_qtype=gguf.GGMLQuantizationType.MXFP4)
    _compare(reference, model, LLAMA3_VOCAB_SIZE, IN_PLACE_TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_q8_0_runs_in_place_with_the_kernels(converted, family):
    root, models = converted
    _compare(rounded(models[family], "q8_0"), _in_place(_converted_file(root, family, "q8_0")), LLAMA3_VOCAB_SIZE,
             IN_PLACE_TOLERANCE)


@torch.inference_mode()
def test_the_engine_plans_mxfp4_experts_in_place(converted):
    """A file whose only blocks are gpt-oss's (3-D) MXFP4 experts: the engine's default
    plan keeps them (where the kernels run) and the model it builds runs them in place."""
    from inferpath.config import EngineConfig
    from inferpath.engine.load import build_for_engine, load_weights
    from inferpath.kernels.quant_experts import QuantFusedExperts
    from inferpath.kernels.quantized import quantized_kernels_available

    if not quantized_kernels_available():
        pytest.skip("no quantized kernels here: the blocks are dequantized (the reference path)")
    root, models = converted
    path = root / "gpt-oss-mxfp4.gguf"
    if not path.is_file():
        mxfp4_file(_converted_file(root, "gpt-oss", "f32"), path)
    engine_config = EngineConfig(threads=1)
    checkpoint, plan = load_weights(path, engine_config)
    assert plan.keep_quantized and "MXFP4" in plan.runs
    model = build_for_engine(checkpoint, plan, engine_config).eval()
    assert isinstance(model.model.layers[1].mlp.experts, QuantFusedExperts)
    reference = rounded(models["gpt-oss"], "f32", expert_qtype=gguf.GGMLQuantizationType.MXFP4)
    _compare(reference, model, LLAMA3_VOCAB_SIZE, IN_PLACE_TOLERANCE)
