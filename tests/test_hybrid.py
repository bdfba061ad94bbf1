"""Qwen3-Next (Gated DeltaNet linear attention beside gated full attention) against
transformers 5.24, and the block manager's state slots.

Tiny random models built offline from a Qwen3NextConfig, saved and loaded by inferpath:
logits within 1e-4 of transformers over a prefill in three chunks (one longer than the
delta rule's 64-token chunk) and 8 decode steps, batched with sequences of other lengths,
in the engine with chunked prefill and a forced preemption; the chunked form of the delta
rule against the recurrent one; state-slot accounting under hypothesis.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.cache.blocks import BlockManager
from inferpath.cache.kv import KVCache
from inferpath.config import EngineConfig, ModelConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.model import build_model
from inferpath.model.gated_deltanet import chunked_delta_rule, recurrent_step
from inferpath.model.metadata import AttentionMetadata
from inferpath.sampling.params import SamplingParams
from inferpath.weights import load_checkpoint

import transformers  # test-only reference
from test_model import rel_err

VOCAB, BLOCK = 256, 4


def tiny_config(**overrides) -> transformers.Qwen3NextConfig:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, num_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                max_position_embeddings=256, initializer_range=0.1, attn_implementation="eager")
    return transformers.Qwen3NextConfig(**(base | overrides))


def build_pair(tmp_path, **overrides):
    torch.manual_seed(0)
    hf = transformers.Qwen3NextForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):  # ones / zeros at init: make them count
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "qwen3-next"
    hf.save_pretrained(path)
    return hf, build_model(load_checkpoint(path))


class StateRunner:
    """A stand-in for the engine's runner: shuffled blocks, one state slot per sequence."""

    def __init__(self, model, num_blocks: int = 96, num_slots: int = 6, seed: int = 0) -> None:
        self.model, self.cache = model, KVCache(model.config, num_blocks, BLOCK, model.dtype, num_state_slots=num_slots)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.slots = list(range(num_slots))
        random.Random(seed + 1).shuffle(self.slots)
        self.tokens, self.blocks, self.slot = {}, {}, {}

    @torch.inference_mode()
    def step(self, chunks):
        ids, positions, slots, query_lens, seq_lens, states = [], [], [], [], [], []
        for seq, new in chunks:
            tokens, blocks = self.tokens.setdefault(seq, []), self.blocks.setdefault(seq, [])
            if seq not in self.slot:
                self.slot[seq] = self.slots.pop()
            state = self.slot[seq]
            start = len(tokens)
            tokens.extend(new)
            while len(blocks) * BLOCK < len(tokens):
                blocks.append(self.free.pop())
            slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, len(tokens))]
            ids += new
            positions += range(start, len(tokens))
            query_lens.append(len(new))
            seq_lens.append(len(tokens))
            states.append(state)
        width = max(len(self.blocks[s]) for s, _ in chunks)
        tables = [self.blocks[s] + [0] * (width - len(self.blocks[s])) for s, _ in chunks]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        meta = AttentionMetadata(torch.tensor(slots), torch.tensor(starts), torch.tensor(seq_lens),
                                 torch.tensor(tables), query_lens, seq_lens, BLOCK, state_slots=states)
        hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.cache, meta)
        return self.model.compute_logits(hidden[torch.tensor(starts[1:]) - 1])


def prompt_of(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_greedy(hf, prompt, steps):
    out = hf(torch.tensor([prompt]), use_cache=True)
    logits, cache = [out.logits[0, -1]], out.cache
    for _ in range(steps):
        out = hf(torch.tensor([[int(logits[-1].argmax())]]), cache=cache, use_cache=True)
        logits.append(out.logits[0, -1])
        cache = out.cache
    return logits


def test_config_and_cache_hold_attention_kv_and_states_by_hand():
    config = ModelConfig.from_hf_config(tiny_config().to_dict())
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    cache = KVCache(config, num_blocks=5, block_size=4, num_state_slots=3)
    assert [k.numel() for k in cache.k_caches[:3]] == [0, 0, 0] and cache.k_caches[3].shape == (5, 4, 2, 16)
    assert cache.num_bytes == cache.bytes_per_token * 4 * 5 == 2 * 1 * 2 * 16 * 4 * 4 * 5
    # per slot and linear layer: conv (2 x 2 x 8 + 4 x 12 = 80 channels) x 3 + 4 heads x 8 x 12, 4 B each
    assert cache.state_bytes == 3 * 3 * (80 * 3 + 4 * 8 * 12) * 4


def test_chunked_delta_rule_equals_the_recurrent_form():
    gen = torch.Generator().manual_seed(0)
    heads, length, dk, dv = 3, 23, 8, 5
    q, k = (torch.nn.functional.normalize(torch.randn(heads, length, dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(heads, length, dv, generator=gen)
    g = -torch.rand(heads, length, generator=gen)  # log decays
    beta = torch.rand(heads, length, generator=gen)
    state0 = torch.randn(heads, dk, dv, generator=gen)
    out, state = chunked_delta_rule(q, k, v, g, beta, state0, chunk=5)  # 5 chunks, the last partial
    s, outs = state0.unsqueeze(0), []
    for t in range(length):
        o, s = recurrent_step(q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t], beta[None, :, t], s)
        outs.append(o[0])
    assert torch.allclose(out, torch.stack(outs, dim=1), atol=1e-5)
    assert torch.allclose(state, s[0], atol=1e-5)


@torch.inference_mode()
def test_logits_match_transformers_chunked_prefill_and_decode(tmp_path):
    hf, ours = build_pair(tmp_path)
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


@torch.inference_mode()
def test_one_prefill_equals_the_prompt_fed_token_by_token(tmp_path):
    """The chunked (parallel) form inside the model against its recurrent form."""
    _, ours = build_pair(tmp_path)
    prompt = prompt_of(40, seed=3)
    whole = StateRunner(ours).step([(0, prompt)])[0]
    runner = StateRunner(ours, seed=4)
    for token in prompt:
        last = runner.step([(0, [token])])[0]
    assert rel_err(last, whole) < 1e-5


@torch.inference_mode()
def test_batched_sequences_of_different_lengths_match_transformers_alone(tmp_path):
    hf, ours = build_pair(tmp_path)
    prompts = [prompt_of(n, seed=n) for n in (3, 11, 1, 17)]
    refs = [hf_greedy(hf, p, 5) for p in prompts]
    runner = StateRunner(ours, seed=3)
    first = runner.step([(i, prompts[i]) for i in range(3)])
    got = {0: [first[0]], 1: [first[1]], 2: [first[2]], 3: []}
    late = [prompts[3][:9], prompts[3][9:]]  # the fourth prompt arrives later, in two chunks
    for _ in range(7):
        chunks = [(i, [int(got[i][-1].argmax())]) for i in range(3) if len(got[i]) < 6]
        records = [True] * len(chunks)
        if late:
            chunks.append((3, late.pop(0)))
            records.append(not late)
        elif len(got[3]) < 6:
            chunks.append((3, [int(got[3][-1].argmax())]))
            records.append(True)
        logits = runner.step(chunks)
        for row, ((seq, _), keep) in enumerate(zip(chunks, records)):
            if keep:
                got[seq].append(logits[row])
    for i, ref in enumerate(refs):
        assert len(got[i]) == len(ref) == 6
        for step, (a, b) in enumerate(zip(got[i], ref)):
            assert rel_err(a, b) < 1e-4, f"sequence {i} step {step}"


def test_engine_with_chunked_prefill_and_preemption_gives_transformers_greedy_tokens(tmp_path):
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer

    hf, ours = build_pair(tmp_path)
    tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct"))  # only for the text deltas
    prompts = [prompt_of(n, seed=10 + n) for n in (21, 6, 14, 9)]
    with torch.inference_mode():
        expected = [[int(x.argmax()) for x in hf_greedy(hf, p, 9)] for p in prompts]
    engine = LLMEngine(ours, tokenizer, ours.config,
                       EngineConfig(block_size=4, num_kv_blocks=9, max_num_batched_tokens=8, max_num_seqs=4,
                                    cpu_kernels=False), eos_token_ids=[])
    assert "prefix caching is off" in engine.block_manager.prefix_caching_off_reason
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts + [prompts[0]]):  # the last repeats a prompt: no prefix hit
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
    assert finals["r4"].outputs[0].token_ids == expected[0] and finals["r4"].num_cached_tokens == 0
    assert engine.stats().num_kv_blocks_used == 0
    assert engine.block_manager.num_free_state_slots == engine.kv_cache.num_state_slots == 4


def test_batch_invariant_mode_is_refused_for_linear_attention(tmp_path):
    from inferpath.model.batch_invariant import make_batch_invariant

    _, ours = build_pair(tmp_path)
    with pytest.raises(ValueError, match="batch-invariant mode does not support linear-attention"):
        make_batch_invariant(ours)


@torch.inference_mode()
def test_cpu_kernels_match_transformers(tmp_path):
    from inferpath.kernels import accelerate

    hf, ours = build_pair(tmp_path)
    accelerate(ours)
    prompt = prompt_of(30, seed=8)
    refs = hf_greedy(hf, prompt, 4)
    runner = StateRunner(ours)
    got = [runner.step([(0, prompt)])[0]]
    for _ in range(4):
        got.append(runner.step([(0, [int(got[-1].argmax())])])[0])
    assert all(rel_err(a, b) < 1e-4 for a, b in zip(got, refs))


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "free", "preempt", "grow"]), st.integers(0, 50)),
                    max_size=60),
       num_slots=st.integers(1, 4), num_blocks=st.integers(1, 12))
def test_state_slots_never_leak_or_double_allocate(ops, num_slots, num_blocks):
    bm = BlockManager(num_blocks, 4, enable_prefix_caching=True, num_state_slots=num_slots)
    assert not bm.enable_prefix_caching and bm.prefix_caching_off_reason
    running, next_id = {}, 0
    for op, n in ops:
        if op == "admit":
            tokens = 1 + n % 9
            if bm.can_allocate(tokens):
                bm.allocate(next_id, tokens)
                running[next_id] = tokens
                next_id += 1
            else:
                assert len(running) == num_slots or bm.num_blocks_for(tokens) > bm.num_free_blocks
        elif running and op in ("free", "preempt"):  # finish/abort and preemption both free
            seq = sorted(running)[n % len(running)]
            bm.free(seq)
            del running[seq]
            with pytest.raises(KeyError):
                bm.state_slot(seq)
        elif running and op == "grow":
            seq = sorted(running)[n % len(running)]
            if bm.can_append_slots(seq, running[seq] + 1):
                bm.append_slots(seq, running[seq] + 1)
                running[seq] += 1
        owned = [bm.state_slot(s) for s in running]
        assert len(set(owned)) == len(owned) and all(0 <= s < num_slots for s in owned)
        assert bm.num_free_state_slots + len(owned) == num_slots
    for seq in list(running):
        bm.free(seq)
    assert bm.num_free_state_slots == num_slots and bm.num_free_blocks == num_blocks
