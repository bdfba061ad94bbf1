"""Quantizing float weights: on load (``EngineConfig.quantization``) against transformers'
float32 logits, and ``inferpath quantize`` writing a GGUF the ``gguf`` package re-reads
with the expected block types and shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType
from gguf.quants import dequantize
from test_quantized import _teacher_forced_logits

from inferpath.cli import main
from inferpath.kernels import build
from inferpath.kernels.quantized import QuantLinear, build_quantized_model
from inferpath.model import build_model
from inferpath.weights import load_checkpoint
from inferpath.weights.quantize import quantize_checkpoint

import transformers  # test-only reference

Q = GGMLQuantizationType
native = pytest.mark.skipif(build.native_quant_matmul() is None, reason=f"no native kernel: {build.kernel_status()}")


@native
def test_quantize_on_load_q8_0_against_transformers_float32(tmp_path: Path):
    """A tiny random Llama saved by transformers, quantized to Q8_0 on load: its logits
    against transformers' float32 ones, within Q8_0's rounding (weights to 1/254 of each
    32-value block's largest, activations to ~15 bits)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(tmp_path)
    tokens = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0].float()  # (40, vocab)
    checkpoint = quantize_checkpoint(load_checkpoint(tmp_path), "q8_0")
    kinds = {name: t.type_name for name, t in checkpoint.quantized_tensors.items()}
    assert len(kinds) == 2 * 7 + 2 and set(kinds.values()) == {"Q8_0"}  # 7 per layer, embedding, head
    model = build_quantized_model(checkpoint)
    assert isinstance(model.model.layers[1].mlp.down_proj, QuantLinear)
    logits = _teacher_forced_logits(model, tokens, fused_rows=len(tokens))
    error = (logits - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.02, error
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.95
    with pytest.raises(ValueError, match="not supported; use one of q8_0, q4_0, q4_k"):
        quantize_checkpoint(load_checkpoint(tmp_path), "q3_k")


def test_quantize_on_load_keeps_a_tied_head_in_eight_bits(tmp_path: Path):
    """Q4_0 on load: every projection in Q4_0, the embedding table that is also the LM head
    (tied) in Q8_0, as llama.cpp's quantizer keeps its head above 4 bits."""
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    kinds = {name: t.type_name for name, t in quantize_checkpoint(load_checkpoint(tmp_path), "q4_0")
             .quantized_tensors.items()}
    assert kinds.pop("model.embed_tokens.weight") == "Q8_0"
    assert len(kinds) == 7 and set(kinds.values()) == {"Q4_0"}, kinds


def write_float_gguf(path: Path, hidden: int = 256, intermediate: int = 288, vocab: int = 320,
                     alignment: int | None = None) -> None:
    """A tiny random Llama as an F32 GGUF (no tokenizer: weights and shapes only), its
    tensor data aligned to ``alignment`` bytes (None: the GGUF default, 32)."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, arch="llama")
    writer.add_file_type(0)  # ALL_F32: the writer must say what the new file holds
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    kv = hidden // 2  # 2 KV heads of 64

    def add(name, *shape):
        values = (rng.standard_normal(shape) * 0.05).astype(np.float32) if len(shape) == 2 else \
            (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        writer.add_tensor(name, values)

    add("token_embd.weight", vocab, hidden)
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", hidden)
        add(f"blk.{i}.attn_q.weight", hidden, hidden)
        add(f"blk.{i}.attn_k.weight", kv, hidden)
        add(f"blk.{i}.attn_v.weight", kv, hidden)
        add(f"blk.{i}.attn_output.weight", hidden, hidden)
        add(f"blk.{i}.ffn_norm.weight", hidden)
        add(f"blk.{i}.ffn_gate.weight", intermediate, hidden)
        add(f"blk.{i}.ffn_up.weight", intermediate, hidden)
        add(f"blk.{i}.ffn_down.weight", hidden, intermediate)
    add("output_norm.weight", hidden)
    add("output.weight", vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@native
def test_quantize_command_writes_a_gguf_the_gguf_package_reads(tmp_path: Path, capsys):
    source, target = tmp_path / "f32.gguf", tmp_path / "q4_k.gguf"
    write_float_gguf(source)
    assert main(["quantize", str(source), str(target), "--type", "q4_k"]) == 0
    assert "q4_k.gguf" in capsys.readouterr().out
    before = {t.name: t for t in GGUFReader(source).tensors}
    after = {t.name: t for t in GGUFReader(target).tensors}
    assert before.keys() == after.keys()
    for name, t in after.items():
        assert list(t.shape) == list(before[name].shape), name
        if name.endswith("norm.weight"):
            assert t.tensor_type == Q.F32
        elif name.endswith("ffn_down.weight"):  # rows of 288 values: not whole 256-blocks
            assert t.tensor_type == Q.Q8_0
        elif name == "output.weight":  # the LM head keeps 8 bits (llama.cpp keeps it at Q6_K)
            assert t.tensor_type == Q.Q8_0
        else:
            assert t.tensor_type == Q.Q4_K, name
    reader = GGUFReader(target)
    assert reader.get_field("llama.feed_forward_length").contents() == 288
    # what llama.cpp reads from the metadata: the file type it reports ("Q4_K - Small",
    # not the source's F32) and the block layouts' version
    assert reader.get_field("general.file_type").contents() == LlamaFileType.MOSTLY_Q4_K_S
    assert reader.get_field("general.quantization_version").contents() == GGML_QUANT_VERSION
    # inferpath runs the written file quantized: as the gguf package dequantizes it, and
    # near the float file it came from (4-bit random Gaussian weights, plain min/max fit)
    tokens = list(range(3, 60))
    quantized = build_quantized_model(load_checkpoint(target, keep_quantized=True))
    assert isinstance(quantized.model.layers[0].self_attn.q_proj, QuantLinear)
    fused = _teacher_forced_logits(quantized, tokens, fused_rows=len(tokens))
    dequantized = _teacher_forced_logits(build_model(load_checkpoint(target)), tokens)
    original = _teacher_forced_logits(build_model(load_checkpoint(source)), tokens)
    # the K-quant kernels meet the activations in one int8 pass (per 32 values, as llama.cpp's
    # Q8_K does per 256): ~1-2% of the largest logit through the layers, top-1 mostly kept
    assert (fused - dequantized).abs().max() <= 3e-2 * dequantized.abs().max()
    assert (fused.argmax(-1) == dequantized.argmax(-1)).float().mean() >= 0.9  # a random model: near ties
    assert (fused - dequantized).abs().mean() <= 0.2 * (original - dequantized).abs().mean()
    assert torch.corrcoef(torch.stack([fused.flatten(), original.flatten()]))[0, 1] > 0.9


def test_quantize_command_keeps_the_source_alignment_true(tmp_path: Path, capsys):
    """A source whose tensor data is aligned to 64 bytes (general.alignment): the written
    file's key and its padding agree, so the gguf package (like llama.cpp) finds each
    tensor where it is; a copied key over the writer's default 32 would shift every
    tensor's bytes."""
    source, target = tmp_path / "f32.gguf", tmp_path / "q8_0.gguf"
    write_float_gguf(source, hidden=96, intermediate=160, vocab=40, alignment=64)  # rows of 102 bytes
    assert main(["quantize", str(source), str(target), "--type", "Q8_0"]) == 0
    reader = GGUFReader(target)
    assert reader.alignment == 64 and reader.get_field("general.alignment").contents() == 64
    assert reader.get_field("general.file_type").contents() == LlamaFileType.MOSTLY_Q8_0
    before = {t.name: t for t in GGUFReader(source).tensors}
    for t in reader.tensors:
        assert t.data_offset % 64 == 0, t.name
        values = dequantize(t.data, t.tensor_type).reshape(before[t.name].data.shape)
        expected = np.asarray(before[t.name].data)
        assert np.abs(values - expected).max() <= np.abs(expected).max() / 100, t.name  # Q8_0 rounding


def test_quantize_command_refuses_what_it_cannot_read(tmp_path: Path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["quantize", str(tmp_path), str(tmp_path / "out.gguf"), "--type", "Q8_0"]) == 1
    assert "not a .gguf file" in capsys.readouterr().err
