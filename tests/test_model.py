"""The transformer against Hugging Face transformers, on random-weight models built offline.

Each architecture (Llama with llama3 RoPE scaling and a 128,256 vocab, tied and untied;
Qwen2 with QKV bias; Mistral with a sliding window shorter than the test; Mixtral MoE)
must give logits within 1e-4 (relative, fp32) of transformers' for a prefill -- run here
as two chunks, the second on top of cached context -- and for 16 decode steps fed the same
tokens as transformers' own KV-cache decode.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.config import ModelConfig
from inferpath.kernels import accelerate
from inferpath.model import AttentionMetadata, Transformer, WeightLoadError
from inferpath.model.rope import RopeScalingError, RopeTable, RotaryEmbedding
from inferpath.weights.names import split_fused

import transformers  # test-only reference; a hard dependency of the test extras

BLOCK_SIZE = 4
NUM_DECODE_STEPS = 8


class PagedRunner:
    """A tiny stand-in for the engine's runner: shuffled block ids, one flat batch per step."""

    def __init__(self, model: Transformer, num_blocks: int = 64, seed: int = 0) -> None:
        self.model = model
        self.cache = KVCache(model.config, num_blocks, BLOCK_SIZE, model.dtype)
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.tokens: dict[int, list[int]] = {}
        self.blocks: dict[int, list[int]] = {}

    @torch.inference_mode()
    def step(self, chunks: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Append each chunk's tokens to its sequence; logits of each chunk's last token."""
        input_ids, positions, slots, query_lens, seq_lens = [], [], [], [], []
        for seq_id, new_tokens in chunks:
            tokens = self.tokens.setdefault(seq_id, [])
            blocks = self.blocks.setdefault(seq_id, [])
            start = len(tokens)
            tokens.extend(new_tokens)
            while len(blocks) * BLOCK_SIZE < len(tokens):
                blocks.append(self.free_blocks.pop())
            for pos in range(start, len(tokens)):
                slots.append(blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            input_ids += new_tokens
            positions += range(start, len(tokens))
            query_lens.append(len(new_tokens))
            seq_lens.append(len(tokens))
        width = max(len(self.blocks[s]) for s, _ in chunks) + 2  # padded wider than needed
        tables = [self.blocks[s] + [0] * (width - len(self.blocks[s])) for s, _ in chunks]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts),
            seq_lens=torch.tensor(seq_lens), block_tables=torch.tensor(tables),
            query_lens=query_lens, seq_lens_list=seq_lens, block_size=BLOCK_SIZE,
        )
        hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), self.cache, meta)
        return self.model.compute_logits(hidden[torch.tensor(starts[1:]) - 1])


def _tiny(config_cls, **overrides):
    base = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "initializer_range": 0.1, "attn_implementation": "eager"}
    base.update(overrides)
    return config_cls(**base)


CASES = {
    "llama3-128k-vocab-untied": lambda: _tiny(
        transformers.LlamaConfig, vocab_size=128_256, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama3-128k-vocab-tied": lambda: _tiny(
        transformers.LlamaConfig, vocab_size=128_256, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen2-bias": lambda: _tiny(transformers.Qwen2Config, num_attention_heads=8, num_key_value_heads=2),
    "mistral-sliding-window": lambda: _tiny(transformers.MistralConfig, sliding_window=8),
    "mixtral": lambda: _tiny(transformers.MixtralConfig, num_local_experts=4, num_experts_per_tok=2),
    # config fields that change the math (issue 12): each implemented, each against transformers
    "llama-attention-bias": lambda: _tiny(transformers.LlamaConfig, attention_bias=True),
    "llama-mlp-bias": lambda: _tiny(transformers.LlamaConfig, mlp_bias=True),
    "llama-gelu": lambda: _tiny(transformers.LlamaConfig, hidden_act="gelu"),
    "llama-gelu-tanh": lambda: _tiny(transformers.LlamaConfig, hidden_act="gelu_pytorch_tanh"),
    "llama-head-dim-32": lambda: _tiny(transformers.LlamaConfig, head_dim=32),
    "qwen2-window-layers": lambda: _tiny(transformers.Qwen2Config, use_sliding_window=True,
                                         sliding_window=6, max_window_layers=1),
    "qwen2-layer-types": lambda: _tiny(transformers.Qwen2Config, use_sliding_window=True, sliding_window=5,
                                       layer_types=["sliding_attention", "full_attention"]),
    "llama-yarn": lambda: _tiny(transformers.LlamaConfig, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen2-yarn-mscale": lambda: _tiny(transformers.Qwen2Config, rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16,
        "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5}),
    # length-dependent RoPE: the prompt (12) passes the original length, decoding goes further
    "llama-dynamic": lambda: _tiny(transformers.LlamaConfig, max_position_embeddings=10,
                                   rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "phi3-longrope": lambda: _tiny(transformers.Phi3Config, pad_token_id=0, eos_token_id=2,
                                   max_position_embeddings=64, original_max_position_embeddings=15, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [1.0 + 0.7 * i for i in range(8)]}),
    "phi3-sliding-window": lambda: _tiny(transformers.Phi3Config, pad_token_id=0, eos_token_id=2, sliding_window=6),
    "olmoe-qk-norm": lambda: _tiny(transformers.OlmoeConfig, intermediate_size=32, num_experts=4,
                                   num_experts_per_tok=2, pad_token_id=0, eos_token_id=1),
    "olmoe-bias-norm-topk": lambda: _tiny(transformers.OlmoeConfig, intermediate_size=32, num_experts=4,
                                          num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True,
                                          pad_token_id=0, eos_token_id=1),
    "qwen2-moe-shared-expert": lambda: _tiny(transformers.Qwen2MoeConfig, num_hidden_layers=3, intermediate_size=96,
                                             moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                             num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]),
    "qwen2-moe-sparse-step": lambda: _tiny(transformers.Qwen2MoeConfig, intermediate_size=96, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, num_experts=4,
                                           num_experts_per_tok=2, decoder_sparse_step=2, norm_topk_prob=True),
    "gemma3": lambda: _tiny(transformers.Gemma3TextConfig, head_dim=32, query_pre_attn_scalar=24,
                            num_hidden_layers=3, sliding_window=5, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                            final_logit_softcapping=3.0, rope_parameters={
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
    "llama-longrope": lambda: _tiny(transformers.LlamaConfig, max_position_embeddings=64, rope_scaling={
        "rope_type": "longrope", "original_max_position_embeddings": 15,
        "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [1.0 + 0.7 * i for i in range(8)]}),
}
# RoPE whose frequencies follow the sequence length: transformers rotates every prompt key at
# the whole prompt's length, so these prefill in one chunk (chunking changes the math)
UNCHUNKED = {"llama-dynamic", "llama-longrope", "phi3-longrope"}


def hf_to_checkpoint_names(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers 5 fuses Mixtral experts; split them back into the checkpoint layout.
    Phi-3's fused projections are split as the loader splits them (weights/names.py)."""
    if not config.is_moe:
        return split_fused(dict(state), config)
    out, inter = {}, config.expert_intermediate_size
    if config.architecture in ("olmoe", "qwen2_moe"):  # experts under mlp, Llama names
        for name, tensor in state.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                for e in range(tensor.shape[0]):
                    out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = tensor[e, :inter]
                    out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = tensor[e, inter:]
            elif name.endswith("mlp.experts.down_proj"):
                for e in range(tensor.shape[0]):
                    out[name.replace("down_proj", f"{e}.down_proj.weight")] = tensor[e]
            else:
                out[name] = tensor
        return out
    for name, tensor in state.items():
        if ".mlp.gate." in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = tensor
        elif name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.replace("mlp.experts.gate_up_proj", "block_sparse_moe.experts")
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.w1.weight"] = tensor[e, :inter]
                out[f"{prefix}.{e}.w3.weight"] = tensor[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.replace("mlp.experts.down_proj", "block_sparse_moe.experts")
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.w2.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


def build_pair(case: str, cpu_kernels: bool = False):
    """(transformers model, our model) with the same random weights (norms and biases too);
    with ``cpu_kernels`` our linears dispatch to the native GEMV for decode rows."""
    hf_config = CASES[case]()
    torch.manual_seed(0)
    name = type(hf_config).__name__.replace("TextConfig", "Config").replace("Config", "ForCausalLM")
    hf = getattr(transformers, name)(hf_config).eval()
    with torch.no_grad():  # transformers initialises norms to 1 and biases to 0: make them count
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    config = ModelConfig.from_hf_config(hf_config.to_dict())
    ours = Transformer(config)
    ours.load_weights(hf_to_checkpoint_names(hf.state_dict(), config))
    if cpu_kernels:
        accelerate(ours)
    return hf, ours.eval()


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def test_config_parser_reads_transformers_configs():
    config = ModelConfig.from_hf_config(CASES["llama3-128k-vocab-untied"]().to_dict())
    assert config.rope_scaling_dict["rope_type"] == "llama3"
    assert config.rope_scaling_dict["original_max_position_embeddings"] == 64
    assert ModelConfig.from_hf_config(CASES["qwen2-bias"]().to_dict()).attention_bias
    assert ModelConfig.from_hf_config(CASES["mistral-sliding-window"]().to_dict()).sliding_window == 8
    assert ModelConfig.from_hf_config(CASES["mixtral"]().to_dict()).num_experts == 4


@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch-linear", "cpu-kernels"])
@pytest.mark.parametrize("case", list(CASES))
@torch.inference_mode()
def test_logits_match_transformers_prefill_and_decode(case, cpu_kernels):
    hf, ours = build_pair(case, cpu_kernels)
    prompt = torch.randint(0, hf.config.vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf(torch.tensor([prompt]), use_cache=True)
    runner = PagedRunner(ours)
    if case in UNCHUNKED:
        logits = runner.step([(0, prompt)])
    else:
        first = runner.step([(0, prompt[:5])])  # chunked prefill: 5 tokens, then 7 on top of them
        assert rel_err(first[0], ref.logits[0, 4]) < 1e-4
        logits = runner.step([(0, prompt[5:])])
    assert rel_err(logits[0], ref.logits[0, -1]) < 1e-4
    cache = ref.cache
    for step in range(NUM_DECODE_STEPS):
        token = int(ref.logits[0, -1].argmax())
        ref = hf(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = ref.cache
        logits = runner.step([(0, [token])])
        assert rel_err(logits[0], ref.logits[0, -1]) < 1e-4, f"decode step {step}"


@torch.inference_mode()
def test_batch_of_four_matches_each_alone():
    _, model = build_pair("qwen2-bias")
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 9, 1, 14)]
    alone = []
    for prompt in prompts:
        runner = PagedRunner(model)
        steps = [runner.step([(0, prompt)])[0]]
        for token in (7, 11, 13):
            steps.append(runner.step([(0, [token])])[0])
        alone.append(torch.stack(steps))
    runner = PagedRunner(model, seed=5)
    batched = [runner.step([(i, p) for i, p in enumerate(prompts)])]
    for token in (7, 11, 13):
        batched.append(runner.step([(i, [token]) for i in range(len(prompts))]))
    batched = torch.stack(batched, dim=1)  # (num_seqs, steps, vocab)
    for i in range(len(prompts)):
        assert rel_err(batched[i], alone[i]) < 1e-5, f"sequence {i}"


def test_load_weights_errors_name_tensor_and_shape():
    _, model = build_pair("llama3-128k-vocab-tied")
    tensors = dict(model.state_dict())
    tensors.pop("lm_head.weight", None)
    missing = dict(tensors)
    del missing["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(WeightLoadError, match=r"model\.layers\.1\.mlp\.down_proj\.weight.*\(64, 128\)"):
        model.load_weights(missing)
    wrong = dict(tensors)
    wrong["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(WeightLoadError, match=r"k_proj\.weight.*\(64, 64\).*expected \(32, 64\)"):
        model.load_weights(wrong)
    extra = dict(tensors)
    extra["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    with pytest.raises(WeightLoadError, match=r"mlp\.extra\.weight"):
        model.load_weights(extra)


def test_tied_head_shares_the_embedding():
    _, tied = build_pair("llama3-128k-vocab-tied")
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert "lm_head.weight" not in tied.expected_weight_shapes()
    _, untied = build_pair("llama3-128k-vocab-untied")
    assert "lm_head.weight" in untied.expected_weight_shapes()


def test_unknown_rope_scaling_is_rejected():
    config = ModelConfig.from_hf_config(CASES["qwen2-bias"]().to_dict())
    bad = replace(config, rope_scaling=(("factor", 2.0), ("rope_type", "su")))
    with pytest.raises(RopeScalingError, match="'su'"):
        Transformer(bad)


@torch.inference_mode()
def test_rope_scores_depend_only_on_the_gap():
    """The seed: rotate q by position m and k by n, and only n - m survives in q . k."""
    config = ModelConfig.from_hf_config(CASES["llama3-128k-vocab-untied"]().to_dict())
    rotary = RotaryEmbedding(RopeTable(config))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, config.head_dim, generator=gen)
    k = torch.randn(1, 1, config.head_dim, generator=gen)

    def score(m, n):
        q_m, _ = rotary(torch.tensor([m]), q, k)
        _, k_n = rotary(torch.tensor([n]), q, k)
        return (q_m * k_n).sum()

    torch.testing.assert_close(score(3, 10), score(103, 110), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rotary(torch.tensor([57]), q, k)[0].norm(), q.norm())  # a rotation
    assert not torch.allclose(score(3, 10), score(3, 11), atol=1e-3)
