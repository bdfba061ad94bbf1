"""Weights: GGUF files written here with gguf.GGUFWriter, and Hugging Face directories
saved by transformers, must load to the tensors they hold, under Hugging Face names.

The GGUF files are written the way llama.cpp's converter writes them (Q/K rows of Llama
models permuted by its formula, reimplemented below), so un-permuting is checked against
an independent forward permutation. Real-model equality with transformers is in
test_real_models.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from inferpath.weights import WeightsError, load_checkpoint

# A tiny model whose rows are 256 wide, so that every block format (K-quants: 256) fits.
TINY = dict(vocab=32, hidden=256, inter=256, heads=4, kv_heads=2, layers=1)
HEAD_DIM = TINY["hidden"] // TINY["heads"]


def llamacpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute (HF rotate-half → interleaved)."""
    return (w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_tensors(rng: np.random.Generator, *, bias: bool = False, tied: bool = True,
               layers: int = 1) -> dict[str, np.ndarray]:
    """Random float32 tensors named as GGUF names them, in Hugging Face row order."""
    h, i, v = TINY["hidden"], TINY["inter"], TINY["vocab"]
    q, kv = TINY["heads"] * HEAD_DIM, TINY["kv_heads"] * HEAD_DIM
    t = {"token_embd.weight": rng.standard_normal((v, h)), "output_norm.weight": rng.random(h)}
    if not tied:
        t["output.weight"] = rng.standard_normal((v, h))
    for n in range(layers):
        p = f"blk.{n}."
        t |= {p + "attn_norm.weight": rng.random(h), p + "ffn_norm.weight": rng.random(h),
              p + "attn_q.weight": rng.standard_normal((q, h)),
              p + "attn_k.weight": rng.standard_normal((kv, h)),
              p + "attn_v.weight": rng.standard_normal((kv, h)),
              p + "attn_output.weight": rng.standard_normal((h, q)),
              p + "ffn_gate.weight": rng.standard_normal((i, h)),
              p + "ffn_up.weight": rng.standard_normal((i, h)),
              p + "ffn_down.weight": rng.standard_normal((h, i))}
        if bias:
            t |= {p + "attn_q.bias": rng.standard_normal(q), p + "attn_k.bias": rng.standard_normal(kv),
                  p + "attn_v.bias": rng.standard_normal(kv)}
    return {name: a.astype(np.float32) for name, a in t.items()}


def write_gguf(path: Path, arch: str, tensors: dict[str, np.ndarray | tuple[np.ndarray, Q]],
               *, eot: int | None = None, experts: int = 0, rope_scaling: float | None = None) -> Path:
    """Write a GGUF like llama.cpp: metadata, then tensors (raw blocks when a Q is given)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(TINY["layers"])
    w.add_context_length(512)
    w.add_embedding_length(TINY["hidden"])
    w.add_feed_forward_length(TINY["inter"])
    w.add_head_count(TINY["heads"])
    w.add_head_count_kv(TINY["kv_heads"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(50000.0)
    w.add_eos_token_id(2)
    if eot is not None:
        w.add_eot_token_id(eot)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    if rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scaling)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            w.add_tensor(name, value[0], raw_dtype=value[1])
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_layout(tensors: dict[str, np.ndarray], arch: str) -> dict[str, np.ndarray]:
    """The rows as llama.cpp stores them: Q/K (and biases) permuted for Llama only."""
    if arch != "llama":
        return dict(tensors)
    heads = {"attn_q": TINY["heads"], "attn_k": TINY["kv_heads"]}
    return {name: llamacpp_permute(a, heads[name.split(".")[2]])
            if name.startswith("blk.") and name.split(".")[2] in heads else a
            for name, a in tensors.items()}


def hf(name: str) -> str:
    from inferpath.weights.names import hf_name
    return hf_name(name)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_gguf_loads_hf_rows_and_config(tmp_path: Path, arch: str) -> None:
    rng = np.random.default_rng(0)
    original = hf_tensors(rng, bias=arch == "qwen2", tied=arch == "llama")
    path = write_gguf(tmp_path / "m.gguf", arch, gguf_layout(original, arch), eot=7)
    ckpt = load_checkpoint(path)
    assert set(ckpt.tensors) == {hf(n) for n in original}
    for name, array in original.items():
        assert torch.equal(ckpt.tensors[hf(name)], torch.from_numpy(array)), name
    c = ckpt.config
    assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers,
            c.num_heads, c.num_kv_heads, c.head_dim) == (arch, 32, 256, 256, 1, 4, 2, 64)
    assert (c.rope_theta, c.max_position_embeddings) == (50000.0, 512)
    assert c.rms_norm_eps == pytest.approx(1e-6)
    assert c.tie_word_embeddings == (arch == "llama") and c.attention_bias == (arch == "qwen2")
    assert ckpt.eos_token_ids == [2, 7] and ckpt.tokenizer_path == path


def test_permuted_file_differs_from_hf_order(tmp_path: Path) -> None:
    """Guard the test above: the permutation really moves rows, so skipping it would fail."""
    original = hf_tensors(np.random.default_rng(0))
    permuted = gguf_layout(original, "llama")
    assert not np.array_equal(permuted["blk.0.attn_q.weight"], original["blk.0.attn_q.weight"])
    assert not np.array_equal(permuted["blk.0.attn_k.weight"], original["blk.0.attn_k.weight"])


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
def test_quantized_gguf_matches_dequantized_blocks(tmp_path: Path, qtype: Q) -> None:
    original = hf_tensors(np.random.default_rng(1))
    stored = {n: (quantize(a, qtype), qtype) if a.ndim == 2 else a
              for n, a in gguf_layout(original, "llama").items()}
    ckpt = load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", stored))
    for name, array in original.items():
        # blocks run along a row and the permutation moves whole rows, so quantizing the
        # HF-ordered rows gives the same values
        expected = dequantize(quantize(array, qtype), qtype) if array.ndim == 2 else array
        assert torch.equal(ckpt.tensors[hf(name)], torch.from_numpy(expected)), name
        assert np.abs(expected - array).max() <= 0.25 * np.abs(array).max()


def random_k_blocks(rng: np.random.Generator, rows: int, qtype: Q) -> np.ndarray:
    """Random K-quant blocks with small finite f16 scales (the gguf package cannot quantize)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, TINY["hidden"] // block_elems, block_bytes), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, size=(rows, raw.shape[1], 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # ..., int8 scales[16], f16 d (last two bytes)
        raw[..., -2:] = scales[..., :2]
    else:  # f16 d, f16 dmin first
        raw[..., :4] = scales
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_gguf_unpermutes_dequantized_rows(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(2)
    stored: dict[str, np.ndarray | tuple[np.ndarray, Q]] = {}
    for name, array in hf_tensors(rng).items():
        stored[name] = (random_k_blocks(rng, array.shape[0], qtype), qtype) if array.ndim == 2 else array
    ckpt = load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", stored))
    for name, value in stored.items():
        if not isinstance(value, tuple):
            continue
        loaded = ckpt.tensors[hf(name)].numpy()
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if kind in ("attn_q", "attn_k"):  # permuting what we loaded gives back the file's rows
            loaded = llamacpp_permute(loaded, TINY["heads"] if kind == "attn_q" else TINY["kv_heads"])
        expected = dequantize(value[0], qtype)
        assert np.isfinite(expected).all() and np.array_equal(loaded, expected), name


def test_stacked_moe_experts_become_mixtral_names(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    dense = hf_tensors(rng)
    for kind in ("ffn_gate", "ffn_up", "ffn_down"):
        del dense[f"blk.0.{kind}.weight"]
    h, i, e = TINY["hidden"], TINY["inter"], 4
    stacked = {"blk.0.ffn_gate_inp.weight": rng.standard_normal((e, h)).astype(np.float32),
               "blk.0.ffn_gate_exps.weight": rng.standard_normal((e, i, h)).astype(np.float32),
               "blk.0.ffn_up_exps.weight": rng.standard_normal((e, i, h)).astype(np.float32),
               "blk.0.ffn_down_exps.weight": rng.standard_normal((e, h, i)).astype(np.float32)}
    ckpt = load_checkpoint(write_gguf(tmp_path / "moe.gguf", "llama",
                                      gguf_layout(dense, "llama") | stacked, experts=e))
    assert ckpt.config.architecture == "mixtral"
    assert (ckpt.config.num_experts, ckpt.config.num_experts_per_tok) == (4, 2)
    p = "model.layers.0.block_sparse_moe."
    assert torch.equal(ckpt.tensors[p + "gate.weight"], torch.from_numpy(stacked["blk.0.ffn_gate_inp.weight"]))
    for expert in range(e):
        for w, kind in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            expected = stacked[f"blk.0.ffn_{kind}_exps.weight"][expert]
            assert torch.equal(ckpt.tensors[f"{p}experts.{expert}.{w}.weight"], torch.from_numpy(expected))
    assert torch.equal(ckpt.tensors["model.layers.0.self_attn.q_proj.weight"],
                       torch.from_numpy(dense["blk.0.attn_q.weight"]))


def test_rope_scaling_dtype_and_progress(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write_gguf(tmp_path / "m.gguf", "llama", hf_tensors(np.random.default_rng(4)), rope_scaling=4.0)
    ckpt = load_checkpoint(path, dtype="bfloat16", progress=True)
    assert ckpt.config.rope_scaling_dict == {"rope_type": "linear", "factor": 4.0}
    assert all(t.dtype == torch.bfloat16 for t in ckpt.tensors.values())
    assert "loading m.gguf" in capsys.readouterr().err


# ---------------------------------------------------------------- broken GGUF files
@pytest.fixture
def good_gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf", "llama", hf_tensors(np.random.default_rng(5)))


def test_truncated_gguf_names_file_tensor_and_shape(good_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good_gguf.read_bytes()[:-1000])
    with pytest.raises(WeightsError, match=r"cut\.gguf.*tensor 'blk\.0\.\w+\.weight' \(shape \(\d+, 256\)"):
        load_checkpoint(cut)


@pytest.mark.parametrize("keep", [0, 3, 40])
def test_gguf_cut_in_header_raises_weights_error(good_gguf: Path, tmp_path: Path, keep: int) -> None:
    cut = tmp_path / "head.gguf"
    cut.write_bytes(good_gguf.read_bytes()[:keep])
    with pytest.raises(WeightsError, match="head.gguf"):
        load_checkpoint(cut)


def test_wrong_magic_is_rejected(good_gguf: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + good_gguf.read_bytes()[4:])
    with pytest.raises(WeightsError, match=r"bad\.gguf.*magic"):
        load_checkpoint(bad)


def test_missing_gguf_tensor_names_both_names_and_shape(tmp_path: Path) -> None:
    tensors = hf_tensors(np.random.default_rng(6))
    del tensors["blk.0.ffn_up.weight"]
    path = write_gguf(tmp_path / "m.gguf", "llama", tensors)
    with pytest.raises(WeightsError, match=r"m\.gguf: missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight' "
                                           r"\(GGUF tensor 'blk\.0\.ffn_up\.weight'\), expected shape \(256, 256\)"):
        load_checkpoint(path)


def test_wrong_gguf_shape_is_reported(tmp_path: Path) -> None:
    tensors = hf_tensors(np.random.default_rng(7))
    tensors["blk.0.attn_v.weight"] = tensors["blk.0.attn_v.weight"][:, :128].copy()
    path = write_gguf(tmp_path / "m.gguf", "llama", tensors)
    with pytest.raises(WeightsError, match=r"v_proj\.weight'.*shape \(128, 128\), expected \(128, 256\)"):
        load_checkpoint(path)


def test_unsupported_block_format_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    tensors: dict = hf_tensors(rng)
    tensors["blk.0.ffn_up.weight"] = (random_k_blocks(rng, 256, Q.Q2_K), Q.Q2_K)
    with pytest.raises(WeightsError, match=r"'blk\.0\.ffn_up\.weight' is stored as Q2_K"):
        load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", tensors))


def llama3_divisors_from_transformers(factor: float) -> np.ndarray:
    """What llama.cpp stores as rope_freqs: base inverse frequencies / llama3-scaled ones,
    with the scaled ones computed by transformers (the reference)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = transformers.LlamaConfig(hidden_size=TINY["hidden"], num_attention_heads=TINY["heads"],
                                      rope_theta=50000.0, rope_scaling=scaling)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / 50000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    return (base / scaled.double().numpy()).astype(np.float32)


def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path: Path) -> None:
    tensors = hf_tensors(np.random.default_rng(9)) | {"rope_freqs.weight": llama3_divisors_from_transformers(8.0)}
    ckpt = load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", tensors))
    assert ckpt.config.rope_scaling_dict == {
        "rope_type": "llama3", "factor": pytest.approx(8.0), "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert "rope_freqs.weight" not in ckpt.tensors


def test_unknown_rope_freqs_are_refused(tmp_path: Path) -> None:
    divisors = llama3_divisors_from_transformers(8.0)
    divisors[len(divisors) // 2] *= 1.5
    tensors = hf_tensors(np.random.default_rng(9)) | {"rope_freqs.weight": divisors}
    with pytest.raises(WeightsError, match=r"m\.gguf: tensor 'rope_freqs\.weight' .* not supported"):
        load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", tensors))


def test_missing_metadata_is_named(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_embedding_length(TINY["hidden"])
    w.add_tensor("token_embd.weight", np.zeros((TINY["vocab"], TINY["hidden"]), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match=r"m\.gguf: GGUF metadata lacks 'llama\.attention\.head_count'"):
        load_checkpoint(tmp_path / "m.gguf")
