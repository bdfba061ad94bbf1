"""DeepSeek-V3 (multi-head latent attention, DeepSeek MoE) against transformers 5.24.

Tiny random models built offline from a DeepseekV3Config, saved and loaded through
inferpath's own loader: logits within 1e-4 of transformers over a prefill in three chunks
and 8 decode steps, batched with sequences of other lengths, in the engine with chunked
prefill and a forced preemption; and the absorbed decode against the expanded one.
"""

from __future__ import annotations

import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.config import ConfigError, EngineConfig, ModelConfig, require_engine_support
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import accelerate
from inferpath.model import build_model
from inferpath.model.mla import mla_softmax_scale
from inferpath.sampling.params import SamplingParams
from inferpath.weights import load_checkpoint

import transformers  # test-only reference
from test_model import PagedRunner, rel_err

VOCAB = 256
VARIANTS = {
    "q-lora-interleaved": {},
    "full-rank-q": dict(q_lora_rank=None, n_shared_experts=2),
    "rope-not-interleaved": dict(rope_interleave=False),
    "yarn-mscale": dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 8.0, "beta_slow": 1.0, "mscale": 0.9, "mscale_all_dim": 0.7}),
}


def tiny_config(**overrides) -> transformers.DeepseekV3Config:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=16,
                q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, max_position_embeddings=256,
                initializer_range=0.1, routed_scaling_factor=2.5, attn_implementation="eager")
    return transformers.DeepseekV3Config(**(base | overrides))


def build_pair(tmp_path, variant: str = "q-lora-interleaved", cpu_kernels: bool = False):
    """(transformers model, ours) with the same random weights, ours loaded from the saved
    directory by inferpath's loader; norms and the correction bias made to count."""
    torch.manual_seed(0)
    hf = transformers.DeepseekV3ForCausalLM(tiny_config(**VARIANTS[variant])).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init: selection would ignore it
                b.normal_(0.0, 0.2)
    path = tmp_path / variant
    hf.save_pretrained(path)
    ours = build_model(load_checkpoint(path))
    if cpu_kernels:
        accelerate(ours)
    return hf, ours


def prompt_of(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_greedy(hf, prompt: list[int], steps: int):
    """transformers' logits at the prompt's last position and at each of ``steps`` greedy decodes."""
    out = hf(torch.tensor([prompt]), use_cache=True)
    logits, cache = [out.logits[0, -1]], out.cache
    for _ in range(steps):
        out = hf(torch.tensor([[int(logits[-1].argmax())]]), cache=cache, use_cache=True)
        logits.append(out.logits[0, -1])
        cache = out.cache
    return out, logits


def test_config_reads_the_latent_attention_fields():
    config = ModelConfig.from_hf_config(tiny_config(**VARIANTS["yarn-mscale"]).to_dict())
    assert (config.kv_lora_rank, config.qk_rope_head_dim, config.q_lora_rank, config.dense_layers) == (16, 8, 24, (0,))
    assert config.router_scoring == "sigmoid" and config.router_correction_bias and config.rope_interleave
    require_engine_support(config)
    # transformers' softmax scale: (n + p) ** -0.5 x mscale(4, 0.7) ** 2
    hf = transformers.DeepseekV3ForCausalLM(tiny_config(**VARIANTS["yarn-mscale"]))
    assert mla_softmax_scale(config) == pytest.approx(hf.model.layers[0].self_attn.scaling, rel=1e-12)


def test_a_block_holds_latents():
    config = ModelConfig.from_hf_config(tiny_config().to_dict())
    cache = KVCache(config, num_blocks=5, block_size=4)
    assert cache.k_caches[0].shape == (5, 4, 1, 16 + 8) and cache.v_caches[0].numel() == 0
    assert cache.num_bytes == cache.bytes_per_token * 4 * 5 == 3 * (16 + 8) * 4 * 4 * 5


@pytest.mark.parametrize("variant,cpu_kernels", [(v, False) for v in VARIANTS] + [("q-lora-interleaved", True)],
                         ids=[*VARIANTS, "cpu-kernels"])
@torch.inference_mode()
def test_logits_match_transformers_chunked_prefill_and_decode(tmp_path, variant, cpu_kernels):
    hf, ours = build_pair(tmp_path, variant, cpu_kernels)
    prompt = prompt_of(20)
    ref = hf(torch.tensor([prompt]), use_cache=True)
    runner = PagedRunner(ours)
    for start, end in ((0, 6), (6, 13), (13, 20)):  # a prefill in three chunks, each on top of the last
        logits = runner.step([(0, prompt[start:end])])
        assert rel_err(logits[0], ref.logits[0, end - 1]) < 1e-4, f"chunk ending at {end}"
    cache = ref.cache
    for step in range(8):
        token = int(ref.logits[0, -1].argmax())
        ref = hf(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = ref.cache
        logits = runner.step([(0, [token])])
        assert rel_err(logits[0], ref.logits[0, -1]) < 1e-4, f"decode step {step}"


@torch.inference_mode()
def test_batched_sequences_of_different_lengths_match_transformers_alone(tmp_path):
    hf, ours = build_pair(tmp_path)
    prompts = [prompt_of(n, seed=n) for n in (3, 11, 1, 17)]
    refs = [hf_greedy(hf, p, 6)[1] for p in prompts]
    runner = PagedRunner(ours, num_blocks=96, seed=3)
    # step 1: the first three prompts whole; the fourth starts later, so decodes and a
    # prefill chunk share steps
    first = runner.step([(i, prompts[i]) for i in range(3)])
    got = {i: [first[i]] for i in range(3)}
    got[3] = []
    late = [(3, prompts[3][:9]), (3, prompts[3][9:])]
    for step in range(8):
        chunks = [(i, [int(got[i][-1].argmax())]) for i in range(3) if len(got[i]) <= 6]
        if late:
            chunk = late.pop(0)
            chunks.append(chunk)
            last_chunk = not late
        elif len(got[3]) <= 6:
            chunks.append((3, [int(got[3][-1].argmax())]))
            last_chunk = True
        else:
            last_chunk = False
        if not chunks:
            break
        logits = runner.step(chunks)
        for row, (seq, _) in enumerate(chunks):
            if seq != 3 or last_chunk:
                got[seq].append(logits[row])
    for i, ref in enumerate(refs):
        assert len(got[i]) == len(ref)
        for step, (a, b) in enumerate(zip(got[i], ref)):
            assert rel_err(a, b) < 1e-4, f"sequence {i} step {step}"


@torch.inference_mode()
def test_absorbed_decode_equals_expanded_decode(tmp_path):
    _, absorbed = build_pair(tmp_path)
    _, expanded = build_pair(tmp_path / "b")
    for layer in expanded.model.layers:
        layer.self_attn.attn.absorb_decode = False
    prompts = [prompt_of(n, seed=n) for n in (5, 13, 2)]  # different lengths: the decode mask is used
    runs = []
    for model in (absorbed, expanded):
        runner = PagedRunner(model, seed=7)
        steps = [runner.step([(i, p) for i, p in enumerate(prompts)])]
        for token in (3, 99, 250, 17, 42, 8, 200, 1):
            steps.append(runner.step([(i, [token]) for i in range(len(prompts))]))
        runs.append(torch.stack(steps))
    assert rel_err(runs[0], runs[1]) < 1e-5


def test_engine_with_chunked_prefill_and_preemption_gives_transformers_greedy_tokens(tmp_path):
    from inferpath.tokenizer import load_tokenizer
    from inferpath.models import resolve_model

    hf, ours = build_pair(tmp_path)
    tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct"))  # only for the text deltas
    prompts = [prompt_of(n, seed=10 + n) for n in (21, 6, 14, 9)]
    with torch.inference_mode():
        expected = [[int(x.argmax()) for x in hf_greedy(hf, p, 9)[1]] for p in prompts]
    # 9 blocks of 4 slots for four sequences of up to 31 tokens: preemption is forced;
    # 8 tokens a step: the 21-token prompt is prefilled over 3 steps
    engine = LLMEngine(ours, tokenizer, ours.config,
                       EngineConfig(block_size=4, num_kv_blocks=9, max_num_batched_tokens=8, max_num_seqs=4,
                                    cpu_kernels=False), eos_token_ids=[])
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    finals = {}
    for _ in range(400):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output.outputs[0].token_ids
    assert engine.stats().num_preemptions > 0
    assert [finals[f"r{i}"] for i in range(len(prompts))] == expected
    assert engine.stats().num_kv_blocks_used == 0
    # a prefix-cache hit reads the latents another request left: 16 shared tokens, 4 blocks
    shared = prompts[0][:16] + prompt_of(5, seed=99)
    with torch.inference_mode():
        expected_shared = [int(x.argmax()) for x in hf_greedy(hf, shared, 9)[1]]
    engine = LLMEngine(ours, tokenizer, ours.config, EngineConfig(block_size=4, num_kv_blocks=32, cpu_kernels=False),
                       eos_token_ids=[])
    for request_id, prompt in (("first", prompts[0]), ("shared", shared)):
        engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finals[output.request_id] = output
    assert finals["shared"].num_cached_tokens == 16
    assert finals["shared"].outputs[0].token_ids == expected_shared


@torch.inference_mode()
def test_batch_invariant_mode_gives_the_same_bits_alone_and_batched(tmp_path):
    from inferpath.model.batch_invariant import make_batch_invariant, row_invariant_dispatch

    _, model = build_pair(tmp_path)
    make_batch_invariant(model)
    prompt, others = prompt_of(9, seed=4), [prompt_of(n, seed=n) for n in (15, 2)]
    with row_invariant_dispatch():
        alone = PagedRunner(model)
        solo = [alone.step([(0, prompt)])[0]] + [alone.step([(0, [t])])[0] for t in (5, 6)]
        batched = PagedRunner(model, seed=9)
        together = [batched.step([(1, others[0]), (0, prompt), (2, others[1])])[1]]
        together += [batched.step([(1, [t]), (0, [t]), (2, [t])])[1] for t in (5, 6)]
    assert all(torch.equal(a, b) for a, b in zip(solo, together))


def test_engine_refuses_deepseek_variants_it_does_not_implement():
    config = ModelConfig.from_hf_config(tiny_config().to_dict())
    from dataclasses import replace

    for field, value in (("router_scoring", "softmax"), ("router_correction_bias", False),
                         ("linear_num_key_heads", 2)):
        with pytest.raises(ConfigError, match=field):
            require_engine_support(replace(config, **{field: value}))
