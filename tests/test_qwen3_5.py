"""Qwen3.5 (dense and MoE, the text-only ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``
checkpoints) against transformers 5.24.

Qwen3.5's layers are Qwen3-Next's (Gated DeltaNet beside gated full attention, zero-centred
norms, partial rotary); what differs is the linear layers' projections, stored apart
(``in_proj_qkv`` as all q, all k, all v; ``in_proj_z``, ``in_proj_b``, ``in_proj_a``) instead
of grouped per key head, a dense MLP in the dense model, and an MRoPE that text positions
reduce to plain RoPE. Tiny random models built offline from the two text configs, saved and
loaded by inferpath: logits within 1e-4 over a prefill in three chunks (one crossing the
delta rule's 64-token chunk) and 8 decode steps, batched with sequences of other lengths,
and in the engine with chunked prefill and a forced preemption.
"""

from __future__ import annotations

import pytest
import torch

from inferpath.config import ConfigError, EngineConfig, ModelConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.model import build_model
from inferpath.sampling.params import SamplingParams
from inferpath.weights import load_checkpoint

import transformers  # test-only reference
from test_hybrid import StateRunner, hf_greedy, prompt_of
from test_model import rel_err

VOCAB = 256
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, max_position_embeddings=256,
            initializer_range=0.1, attn_implementation="eager",
            # as the released configs write it: MRoPE sections, interleaved
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True})
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=40)
VARIANTS = {
    "dense": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM, {}),
    "moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM, MOE),
    "dense-tied-more-attention": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM, dict(
        tie_word_embeddings=True, layer_types=["linear_attention", "full_attention"] * 2)),
}


def build_pair(tmp_path, variant: str):
    config_cls, model_cls, extra = VARIANTS[variant]
    torch.manual_seed(0)
    hf = model_cls(config_cls(**(BASE | extra))).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith(("dt_bias", "A_log")):  # constant at init
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / variant
    hf.save_pretrained(path)
    return hf, build_model(load_checkpoint(path))


def test_config_reads_the_split_projections_and_drops_the_mrope_keys():
    config = ModelConfig.from_hf_config(transformers.Qwen3_5MoeTextConfig(**(BASE | MOE)).to_dict())
    assert (config.architecture, config.linear_split_projections, config.num_experts) == ("qwen3_5_moe_text", True, 8)
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert config.partial_rotary_factor == 0.25 and config.rope_scaling is None
    dense = ModelConfig.from_hf_config(transformers.Qwen3_5TextConfig(**BASE).to_dict())
    assert dense.num_experts == 0 and dense.linear_split_projections


def test_an_expert_field_on_the_dense_model_is_refused_by_name():
    cfg = transformers.Qwen3_5TextConfig(**BASE).to_dict() | {"num_experts": 4}
    with pytest.raises(ConfigError, match="'num_experts'"):
        ModelConfig.from_hf_config(cfg)


@pytest.mark.parametrize("variant", VARIANTS)
@torch.inference_mode()
def test_logits_match_transformers_chunked_prefill_and_decode(tmp_path, variant):
    hf, ours = build_pair(tmp_path, variant)
    prompt = prompt_of(90)
    ref = hf(torch.tensor([prompt]), use_cache=True)
    runner = StateRunner(ours)
    for start, end in ((0, 70), (70, 71), (71, 90)):  # 70 crosses a 64-token chunk; a 1-token chunk
        logits = runner.step([(0, prompt[start:end])])
        assert rel_err(logits[0], ref.logits[0, end - 1]) < 1e-4, f"chunk ending at {end}"
    cache = ref.cache
    for step in range(8):
        token = int(ref.logits[0, -1].argmax())
        ref = hf(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = ref.cache
        logits = runner.step([(0, [token])])
        assert rel_err(logits[0], ref.logits[0, -1]) < 1e-4, f"decode step {step}"


@pytest.mark.parametrize("variant", ["dense", "moe"])
@torch.inference_mode()
def test_batched_sequences_of_different_lengths_match_transformers_alone(tmp_path, variant):
    hf, ours = build_pair(tmp_path, variant)
    prompts = [prompt_of(n, seed=n) for n in (3, 11, 1, 17)]
    refs = [hf_greedy(hf, p, 8) for p in prompts]
    runner = StateRunner(ours, seed=3)
    first = runner.step([(i, prompts[i]) for i in range(3)])
    got = {0: [first[0]], 1: [first[1]], 2: [first[2]], 3: []}
    late = [prompts[3][:5], prompts[3][5:9], prompts[3][9:]]  # the fourth arrives later, in three chunks
    for _ in range(11):
        chunks = [(i, [int(got[i][-1].argmax())]) for i in range(3) if len(got[i]) < 9]
        records = [True] * len(chunks)
        if late:
            chunks.append((3, late.pop(0)))
            records.append(not late)
        elif len(got[3]) < 9:
            chunks.append((3, [int(got[3][-1].argmax())]))
            records.append(True)
        logits = runner.step(chunks)
        for row, ((seq, _), keep) in enumerate(zip(chunks, records)):
            if keep:
                got[seq].append(logits[row])
    for i, ref in enumerate(refs):
        assert len(got[i]) == len(ref) == 9
        for step, (a, b) in enumerate(zip(got[i], ref)):
            assert rel_err(a, b) < 1e-4, f"sequence {i} step {step}"


def test_engine_with_chunked_prefill_and_preemption_gives_transformers_greedy_tokens(tmp_path):
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer

    hf, ours = build_pair(tmp_path, "moe")
    tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct"))  # only for the text deltas
    prompts = [prompt_of(n, seed=10 + n) for n in (21, 6, 14, 9)]
    with torch.inference_mode():
        expected = [[int(x.argmax()) for x in hf_greedy(hf, p, 9)] for p in prompts]
    engine = LLMEngine(ours, tokenizer, ours.config,
                       EngineConfig(block_size=4, num_kv_blocks=9, max_num_batched_tokens=8, max_num_seqs=4,
                                    cpu_kernels=False), eos_token_ids=[])
    assert "prefix caching is off" in engine.block_manager.prefix_caching_off_reason
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    finals = {}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    assert engine.stats().num_preemptions > 0
    assert [finals[f"r{i}"].outputs[0].token_ids for i in range(len(prompts))] == expected
    assert engine.block_manager.num_free_state_slots == engine.kv_cache.num_state_slots == 4
