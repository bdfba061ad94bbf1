"""The trace of an MoE model says which experts each layer's router chose, and prices them.

A tiny random Qwen3-MoE (8 experts, top-2, every other layer MoE) is built by transformers,
saved, served by inferpath and traced. The reference for the routing is transformers' own
router on the same weights and tokens (a forward hook on each MoE layer's ``mlp.gate``,
top-k of its softmax, per position); the reference for the price is the experts' bytes
counted by hand (hidden x width float32 per matrix).
"""

from __future__ import annotations

import pytest
import torch
import transformers  # test-only reference

from inferpath.engine.trace_experts import moe_blocks

BASE = dict(vocab_size=128_256, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
E, K, WIDTH, HIDDEN = 8, 2, 16, 32
NEAR_TIE = 1e-4  # router probabilities this close may order differently in two float32 paths


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from gguf_convert import save_tiny

    from inferpath import LLM, SamplingParams
    from inferpath.engine.trace import trace

    directory = tmp_path_factory.mktemp("qwen3_moe")
    hf = transformers.Qwen3MoeConfig(**BASE, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=WIDTH,
                                     decoder_sparse_step=2)
    reference = save_tiny(hf, directory, "llama3")
    llm = LLM(str(directory), max_num_seqs=2, dtype="float32")  # transformers routes in float32
    with trace(llm.engine) as tracer:
        (out,) = llm.generate("The capital of France is a city of", SamplingParams(max_tokens=4, temperature=0,
                                                                                   ignore_eos=True))
    return llm, reference, tracer, out


def reference_choices(reference, token_ids: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """{MoE layer: (top-k experts (seq, k), probabilities (seq, E))} of transformers' routers."""
    found = {}
    hooks = []
    for i, layer in enumerate(reference.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, torch.nn.Module) and hasattr(gate, "top_k"):
            def keep(module, args, output, i=i):
                probs = output[0].float().softmax(dim=-1)  # (seq, E)
                found[i] = (probs.topk(module.top_k, dim=-1).indices, probs)
            hooks.append(gate.register_forward_hook(keep))
    try:
        with torch.no_grad():
            reference(torch.tensor([token_ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return found


def chosen(top: torch.Tensor, probs: torch.Tensor, positions: range) -> tuple[set[int], set[int]]:
    """(experts chosen at ``positions``, those of them whose choice was a near tie)."""
    experts, ties = set(), set()
    for p in positions:
        ranked = probs[p].sort(descending=True)
        experts |= set(top[p].tolist())
        if ranked.values[K - 1] - ranked.values[K] < NEAR_TIE:
            ties |= {int(ranked.indices[K - 1]), int(ranked.indices[K])}
    return experts, ties


def test_each_step_records_the_experts_transformers_router_chooses(served):
    llm, reference, tracer, out = served
    records = tracer.steps_of(out.request_id)
    prompt, generated = list(out.prompt_token_ids), out.outputs[0].token_ids
    refs = reference_choices(reference, prompt + generated[:-1])
    moe_layers = [i for i, _ in moe_blocks(llm.engine.runner.model)]
    assert moe_layers == sorted(refs) == [1, 3]
    assert len(records) == 1 + len(generated) - 1
    for record in records:
        (chunk,) = record.chunks
        assert sorted(record.experts_touched) == moe_layers
        positions = range(chunk.start, chunk.start + chunk.num_new_tokens)
        for layer, (top, probs) in refs.items():
            mine = record.experts_touched[layer]
            expected, ties = chosen(top, probs, positions)
            assert set(mine) ^ expected <= ties, (record.index, layer, mine, expected)
            # every token routes to k experts: the rows the experts ran on add up to k a token
            assert sum(mine.values()) == K * chunk.num_new_tokens
            assert record.num_experts_touched[layer] == len(mine) <= min(E, K * chunk.num_new_tokens)


def test_the_routed_price_is_the_distinct_experts_bytes_beside_the_nominal(served):
    from inferpath.explain.hardware import get_hardware
    from inferpath.explain.trace import request_trace

    llm, _, tracer, out = served
    view = request_trace(tracer, out.request_id, llm.engine, get_hardware("h100-sxm"))
    one_matrix = HIDDEN * WIDTH * 4  # float32 bytes of one expert's gate, up or down matrix
    prefill, *decodes = view["steps"]
    for step in view["steps"]:
        experts = step["experts"]
        assert experts["num_experts"] == E and experts["top_k"] == K
        assert experts["distinct"] == sum(layer["distinct"] for layer in experts["layers"])
        assert experts["weight_bytes_read"] == pytest.approx(3 * one_matrix * experts["distinct"])
        (moe_row,) = [r for r in step["stages"] if "routed_predicted_s" in r]
        assert "router" in moe_row["covers"]
    # a decode token chooses exactly k in each layer, as the nominal price assumes: the same price
    for step in decodes:
        assert all(layer["distinct"] == K for layer in step["experts"]["layers"])
        assert step["experts"]["weight_bytes_read"] == pytest.approx(step["experts"]["weight_bytes_nominal"])
        (moe_row,) = [r for r in step["stages"] if "routed_predicted_s" in r]
        assert moe_row["routed_predicted_s"] == pytest.approx(moe_row["predicted_s"])
    # the prompt's tokens share experts: fewer read than k a token, and the nominal expected
    # union of uniform routing is what the cost model assumed
    ex = prefill["experts"]
    assert ex["num_tokens"] == prefill["num_new_tokens"] > 1
    assert ex["weight_bytes_nominal"] == pytest.approx(3 * one_matrix * 2 * ex["expected_per_layer"])
    assert ex["distinct"] <= 2 * ex["top_k_per_layer"]


def test_no_expert_wrapper_stays_after_the_trace(served):
    llm, *_ = served
    assert all("forward" not in vars(m) and "expert" not in vars(m) for m in llm.engine.runner.model.modules())


def test_the_trace_text_names_the_experts_touched(served):
    from inferpath.explain.hardware import get_hardware
    from inferpath.explain.trace import request_trace
    from inferpath.explain.trace_report import trace_text

    llm, _, tracer, out = served
    view = request_trace(tracer, out.request_id, llm.engine, get_hardware("h100-sxm"))
    text = trace_text(view)
    first = view["steps"][0]["experts"]["layers"][0]
    assert f"L{first['layer']}: {first['experts']}" in text and "top-2 a token" in text
