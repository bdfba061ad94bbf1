"""The families of issue 20 from Hugging Face directories, against transformers.

Each case is a tiny random model that transformers builds offline from its family's config
(norms and biases perturbed so that they count), saved with ``save_pretrained`` and loaded
by inferpath from the directory as a user's checkpoint would be. Three sequences of
different lengths share every step: one prefills whole, one in two chunks, one joins while
the others decode, then all decode 8 steps together. Every row's logits must be within
1e-4 (relative to the largest, fp32) of transformers' own prefill and KV-cache decode of
that sequence alone, with the CPU kernels off and on (``EngineConfig(cpu_kernels=...)``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferpath.config import EngineConfig, ModelConfig
from inferpath.engine.load import build_for_engine, load_weights
from inferpath.families import native_decode_refusal
from test_model import PagedRunner, rel_err

import transformers  # test-only reference; a hard dependency of the test extras

NUM_DECODE_STEPS = 8
TOLERANCE = 1e-4
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)


def _config(cls, **overrides) -> transformers.PreTrainedConfig:
    return cls(**(BASE | overrides))


CASES = {
    "qwen3-untied": lambda: _config(transformers.Qwen3Config, head_dim=32, tie_word_embeddings=False),
    "qwen3-tied": lambda: _config(transformers.Qwen3Config, tie_word_embeddings=True),
    "qwen3-bias-window-layers": lambda: _config(transformers.Qwen3Config, num_hidden_layers=3, attention_bias=True,
                                                use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "qwen3-moe-norm-topk-sparse-step": lambda: _config(
        transformers.Qwen3MoeConfig, num_hidden_layers=4, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen3-moe-unnormed-tied": lambda: _config(
        transformers.Qwen3MoeConfig, num_hidden_layers=3, moe_intermediate_size=32, num_experts=6,
        num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1], tie_word_embeddings=True),
    "qwen3-moe-sliding": lambda: _config(
        transformers.Qwen3MoeConfig, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        use_sliding_window=True, sliding_window=6),
    # RoPE skipped on every 2nd layer (the released model: every 4th)
    "smollm3-nope-tied": lambda: _config(transformers.SmolLM3Config, num_hidden_layers=4, no_rope_layer_interval=2),
    "smollm3-sliding-bias-untied": lambda: _config(
        transformers.SmolLM3Config, num_hidden_layers=3, no_rope_layer_interval=3, use_sliding_window=True,
        sliding_window=5, attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    # multipliers far from 1, as Granite 3's (12, 0.015625, 0.22, 8) are
    "granite": lambda: _config(transformers.GraniteConfig, embedding_multiplier=12.0, attention_multiplier=0.04,
                               residual_multiplier=0.22, logits_scaling=8.0),
    "granite-bias-tied": lambda: _config(transformers.GraniteConfig, embedding_multiplier=6.0,
                                         attention_multiplier=0.1, residual_multiplier=0.5, logits_scaling=2.0,
                                         attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "olmo2": lambda: _config(transformers.Olmo2Config),
    "olmo2-bias-tied": lambda: _config(transformers.Olmo2Config, attention_bias=True, tie_word_embeddings=True,
                                       num_hidden_layers=3),
    # RoPE over adjacent pairs (Q/K rows reordered at load), use_bias on every projection
    "ernie4_5-tied": lambda: _config(transformers.Ernie4_5Config, head_dim=32),
    "ernie4_5-bias-untied": lambda: _config(transformers.Ernie4_5Config, use_bias=True, tie_word_embeddings=False,
                                            num_hidden_layers=3),
    # half-rotary heads, 8 experts in 4 groups (the best 2 chosen from), a shared expert, a
    # dense first layer; then per-head QK-norm, Q/K/V biases, two shared experts, one group
    "glm4-moe-groups": lambda: _config(
        transformers.Glm4MoeConfig, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5),
    "glm4-moe-qk-norm-bias": lambda: _config(
        transformers.Glm4MoeConfig, head_dim=32, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=2, use_qk_norm=True, attention_bias=True, norm_topk_prob=False,
        first_k_dense_replace=0, tie_word_embeddings=True),
    # sinks, sliding and full layers alternating (window 5 < the prompts), biases everywhere,
    # top-2 of 4 experts with the clamped SwiGLU (a limit low enough to clamp), YaRN (its default)
    "gpt-oss": lambda: _config(transformers.GptOssConfig, num_hidden_layers=3, head_dim=16, intermediate_size=32,
                               num_local_experts=4, num_experts_per_tok=2, sliding_window=5, swiglu_limit=0.5),
    "gpt-oss-tied-top3": lambda: _config(transformers.GptOssConfig, head_dim=16, intermediate_size=32,
                                         num_local_experts=6, num_experts_per_tok=3, sliding_window=6,
                                         tie_word_embeddings=True),
}


def save_random_model(config: transformers.PreTrainedConfig, directory: Path) -> Path:
    """A random transformers model of ``config`` saved to ``directory`` (norms and biases
    moved off their initial 1 and 0 so that a mistake in them shows in the logits)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith((".bias", "_bias", ".sinks")):
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    return directory


@torch.inference_mode()
def reference(directory: Path, prompts: list[list[int]], num_new: int) -> list[tuple[list[int], torch.Tensor]]:
    """Per prompt, alone: transformers' greedy tokens and the logits (prompt length - 1
    .. + num_new, vocab) of its prefill's last position and of each KV-cache decode step."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    out = []
    for prompt in prompts:
        step = hf(torch.tensor([prompt]), use_cache=True)
        logits, tokens = [step.logits[0, -1]], []
        for _ in range(num_new):
            tokens.append(int(logits[-1].argmax()))
            step = hf(torch.tensor([[tokens[-1]]]), cache=step.cache, use_cache=True)
            logits.append(step.logits[0, -1])
        out.append((tokens, torch.stack(logits)))
    return out


def batched_logits(model, prompts: list[list[int]], tokens: list[list[int]]) -> list[torch.Tensor]:
    """Our logits for the same positions as ``reference``, the sequences sharing steps:
    step 1 prefills sequence 0 and the first 3 tokens of sequence 1; step 2 decodes 0,
    finishes 1's prompt and prefills 2; then every sequence decodes together."""
    runner = PagedRunner(model, num_blocks=96)
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    fed = [0] * len(prompts)  # generated tokens fed so far

    def run(chunks):
        for (seq, _), logits in zip(chunks, runner.step(chunks)):
            rows[seq].append(logits)

    run([(0, prompts[0]), (1, prompts[1][:3])])
    rows[1].clear()  # a partial prompt's last row is no position of the reference
    run([(0, [tokens[0][0]]), (1, prompts[1][3:]), (2, prompts[2])])
    fed[0] = 1
    while any(f < len(t) for f, t in zip(fed, tokens)):
        chunks = [(i, [t[fed[i]]]) for i, t in enumerate(tokens) if fed[i] < len(t)]
        run(chunks)
        for i, _ in chunks:
            fed[i] += 1
    return [torch.stack(r) for r in rows]


def max_differences(case: str, directory: Path, cpu_kernels: bool, native_calls: list | None = None
                    ) -> tuple[float, float]:
    """(max relative, max absolute) logit difference of the case over every compared row;
    ``native_calls`` collects, per step, whether the native decode call ran it."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (11, 7, 4)]
    ref = reference(directory, prompts, NUM_DECODE_STEPS)
    engine_config = EngineConfig(dtype="float32", cpu_kernels=cpu_kernels, threads=1)
    checkpoint, plan = load_weights(directory, engine_config)  # the engine's weight plan
    model = build_for_engine(checkpoint, plan, engine_config).eval()
    if native_calls is not None:
        stack = model.model
        original = stack._decode_natively

        def counting(*args):
            hidden = original(*args)
            native_calls.append(hidden is not None)
            return hidden
        stack._decode_natively = counting
    ours = batched_logits(model, prompts, [tokens for tokens, _ in ref])
    rel = max(rel_err(o, r) for o, (_, r) in zip(ours, ref))
    absolute = max((o - r).abs().max().item() for o, (_, r) in zip(ours, ref))
    for o, (_, r) in zip(ours, ref):
        assert o.shape == r.shape
    return rel, absolute


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """case -> its saved directory, made once per module."""
    made: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in made:
            made[case] = save_random_model(CASES[case](), tmp_path_factory.mktemp(case))
        return made[case]
    return get


@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch", "cpu-kernels"])
@pytest.mark.parametrize("case", list(CASES))
def test_family_directory_matches_transformers_batched(case, cpu_kernels, saved):
    torch.set_num_threads(1)
    rel, absolute = max_differences(case, saved(case), cpu_kernels)
    print(f"{case} cpu_kernels={cpu_kernels}: max relative {rel:.2e}, max absolute {absolute:.2e}")
    assert rel < TOLERANCE


NATIVE = [case for case in CASES if case.startswith("ernie4_5")]  # a Llama layer once loaded


@pytest.mark.parametrize("case", [case for case in CASES if case not in NATIVE])
def test_new_families_are_refused_by_the_native_decode_step(case, saved):
    """Their layers (QK-norm, experts, NoPE, multipliers, post-norms, sinks, partial
    rotary) are not what the native step implements: the allow-list keeps them on the
    module path."""
    config = ModelConfig.from_json_file(saved(case) / "config.json")
    assert native_decode_refusal(config) != ""


@pytest.mark.parametrize("case", NATIVE)
def test_a_family_on_the_native_list_decodes_natively_and_matches(case, saved):
    """ERNIE 4.5 after its Q/K rows are reordered: the decode steps take the native call,
    and the logits still match transformers."""
    from inferpath.kernels import build

    if build.native_decode_layers(torch.float32) is None:
        pytest.skip(build.kernel_status())
    torch.set_num_threads(1)
    calls: list[bool] = []
    rel, _ = max_differences(case, saved(case), True, calls)
    assert sum(calls) >= NUM_DECODE_STEPS and rel < TOLERANCE
