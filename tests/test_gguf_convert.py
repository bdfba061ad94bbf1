"""GGUF files made by llama.cpp's own converter, loaded by inferpath: logits as transformers'.

For each family a tiny random model (2 layers, hidden 64; gguf_convert.py) is saved by
transformers, converted by ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36) to F32, F16
and Q8_0 once per session, and loaded from the GGUF file. Over a prompt of 12 tokens
(prefilled in chunks of 5 and 7) and 8 greedy decode steps, our logits are compared with
transformers' on the saved directory with its weights rounded as the converter stores them
in that format (gguf_convert.rounded_as_converted: F16, or Q8_0 blocks by ``gguf.quants``,
computed from transformers' own tensors), relative to their largest magnitude: within
1e-4 in every format. Q8_0 is also run as the engine runs it: blocks read in place by the
native kernels (their own summation order: within 1e-3; measured <= 1.1e-4).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gguf_convert import LLAMA3_VOCAB_SIZE, SPM_VOCAB_SIZE, convert_all, rounded_as_converted, save_tiny
from test_model import NUM_DECODE_STEPS, PagedRunner, rel_err

from inferpath.kernels import accelerate
from inferpath.kernels.quantized import build_quantized_model
from inferpath.model import build_model
from inferpath.weights import load_checkpoint

import transformers  # test-only reference

FORMATS = ("f32", "f16", "q8_0")
TOLERANCE, IN_PLACE_TOLERANCE = 1e-4, 1e-3


def _tiny(config_cls, vocab_size: int, **overrides):
    base = {"vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "initializer_range": 0.1, "attn_implementation": "eager"}
    return config_cls(**(base | overrides))


BPE = {"bos_token_id": 128_000, "eos_token_id": 128_001}
SPM = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
# family -> (config, tokenizer)
FAMILIES = {
    "llama-untied": (lambda: _tiny(transformers.LlamaConfig, LLAMA3_VOCAB_SIZE, tie_word_embeddings=False, **BPE),
                     "llama3"),
    # what the file does not say follows llama.cpp's rules: query_pre_attn_scalar = head_dim,
    # every 6th layer attends fully (the converter writes no pattern), so 6 layers here
    "gemma3": (lambda: _tiny(transformers.Gemma3TextConfig, SPM_VOCAB_SIZE, head_dim=32, query_pre_attn_scalar=32,
                             num_hidden_layers=6, sliding_window=4,
                             layer_types=["sliding_attention"] * 5 + ["full_attention"],
                             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                              "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                             **SPM), "spm"),
    "gemma2": (lambda: _tiny(transformers.Gemma2Config, SPM_VOCAB_SIZE, head_dim=32, query_pre_attn_scalar=32,
                             sliding_window=4, attn_logit_softcapping=0.5, final_logit_softcapping=3.0, **SPM),
               "spm"),
    "phi3": (lambda: _tiny(transformers.Phi3Config, SPM_VOCAB_SIZE, original_max_position_embeddings=256, **SPM),
             "spm"),
    "mixtral": (lambda: _tiny(transformers.MixtralConfig, SPM_VOCAB_SIZE, num_local_experts=4, num_experts_per_tok=2,
                              **SPM), "spm"),
    "olmoe": (lambda: _tiny(transformers.OlmoeConfig, LLAMA3_VOCAB_SIZE, intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2, pad_token_id=128_004, **BPE), "llama3"),
    "qwen2moe": (lambda: _tiny(transformers.Qwen2MoeConfig, LLAMA3_VOCAB_SIZE, intermediate_size=96,
                               moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
                               num_experts_per_tok=2, **BPE), "llama3"),
    "qwen3": (lambda: _tiny(transformers.Qwen3Config, LLAMA3_VOCAB_SIZE, head_dim=32, tie_word_embeddings=True,
                            **BPE), "llama3"),
    "qwen3moe": (lambda: _tiny(transformers.Qwen3MoeConfig, LLAMA3_VOCAB_SIZE, head_dim=32, intermediate_size=96,
                               moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                               **BPE), "llama3"),
    "olmo2": (lambda: _tiny(transformers.Olmo2Config, LLAMA3_VOCAB_SIZE, pad_token_id=128_004, **BPE), "llama3"),
    "granite": (lambda: _tiny(transformers.GraniteConfig, SPM_VOCAB_SIZE, embedding_multiplier=2.0,
                              attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=3.0, **SPM), "spm"),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict[str, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("llama-cpp-converted")
    models, jobs = {}, []
    for family, (make_config, tokenizer) in FAMILIES.items():
        models[family] = save_tiny(make_config(), root / family, tokenizer)
        jobs += [(root / family, fmt, root / f"{family}-{fmt}.gguf") for fmt in FORMATS]
    convert_all(jobs)
    return root, models


def _converted_file(root: Path, family: str, fmt: str) -> Path:
    path = root / f"{family}-{fmt}.gguf"
    if (error := Path(f"{path}.error")).is_file():
        pytest.fail(f"llama.cpp's converter failed on {family} ({fmt}):\n{error.read_text()}")
    return path


def _compare(reference: torch.nn.Module, ours: torch.nn.Module, vocab_size: int, tolerance: float) -> float:
    """Worst relative logit error over a chunked prefill and NUM_DECODE_STEPS greedy steps."""
    prompt = torch.randint(0, vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = reference(torch.tensor([prompt]), use_cache=True)
    runner = PagedRunner(ours)
    worst = rel_err(runner.step([(0, prompt[:5])])[0], ref.logits[0, 4])
    worst = max(worst, rel_err(runner.step([(0, prompt[5:])])[0], ref.logits[0, -1]))
    cache = ref.cache
    for _ in range(NUM_DECODE_STEPS):
        token = int(ref.logits[0, -1].argmax())
        ref = reference(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = ref.cache
        worst = max(worst, rel_err(runner.step([(0, [token])])[0], ref.logits[0, -1]))
    print(f"relative logit error {worst:.2e}", end=" ")
    assert worst <= tolerance, f"relative logit error {worst:.2e} > {tolerance:.0e}"
    return worst


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_gguf_logits_match_transformers(converted, family, fmt) -> None:
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, family, fmt))
    reference = rounded_as_converted(models[family], fmt)
    assert checkpoint.config.vocab_size == reference.config.vocab_size
    _compare(reference, build_model(checkpoint), reference.config.vocab_size, TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_q8_0_runs_in_place_with_the_kernels(converted, family) -> None:
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, family, "q8_0"), keep_quantized=True)
    assert checkpoint.quantized_tensors  # the matrices stay Q8_0 blocks
    model = build_quantized_model(checkpoint, torch.float32)
    accelerate(model)
    reference = rounded_as_converted(models[family], "q8_0")
    _compare(reference, model.eval(), reference.config.vocab_size, IN_PLACE_TOLERANCE)


def test_converted_vocabularies_encode_as_their_sources(converted) -> None:
    """The converter's vocabularies, read by our GGUF tokenizer: the SentencePiece one
    (Gemma 3's file, add_space_prefix false) gives sentencepiece's own ids, the byte-level
    BPE one (OLMoE's: Llama-3's tokenizer) gives tokenizers' ids, over the corpus
    (English, code, other scripts: byte fallback included)."""
    import sentencepiece
    import tokenizers

    from gguf_convert import spm_model
    from tokenizer_fixtures import llama3_dir, read_corpus

    from inferpath.tokenizer import load_tokenizer

    root, _ = converted
    corpus = read_corpus()
    chunks = [corpus[i:i + 3000] for i in range(0, len(corpus), len(corpus) // 12)]
    spm = sentencepiece.SentencePieceProcessor(model_file=str(spm_model()))
    ours = load_tokenizer(_converted_file(root, "gemma3", "f16"))
    assert any(spm.id_to_piece(i).startswith("<0x") for c in chunks for i in spm.encode(c))  # bytes used
    for chunk in chunks:
        assert ours.encode(chunk, add_bos=False) == spm.encode(chunk)
    bpe = tokenizers.Tokenizer.from_file(str(llama3_dir() / "tokenizer.json"))
    ours = load_tokenizer(_converted_file(root, "olmoe", "f16"))
    for chunk in chunks:
        assert ours.encode(chunk, add_bos=False) == bpe.encode(chunk, add_special_tokens=False).ids
