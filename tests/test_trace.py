"""The live trace on the real SmolLM2-135M-Instruct: stages timed, tokens unchanged."""

from __future__ import annotations

import json

import pytest

from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hooks import LAYER_STAGES, TOP_STAGES
from inferpath.explain.probe import probe_this_machine
from inferpath.explain.trace import load_for_trace, trace_request
from inferpath.explain.trace_report import ROW_ORDER, trace_json, trace_text

PROMPT = "What is a quadratic equation?"
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def loaded():
    return load_for_trace("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hardware(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.json"
    return probe_this_machine(bandwidth_bytes=8 * 2**20, matmul_n=128, cache_path=path)


@pytest.fixture(scope="module")
def traced(loaded, hardware):
    return trace_request(loaded, PROMPT, hardware, max_tokens=MAX_TOKENS)


def test_stage_rows_add_up_to_the_measured_step_time(traced):
    """The timed rows cover the step's wall time to within 10%.

    Each step is timed by one clock around forward + LM head + sampling. Separately, every
    stage module is timed by its own pre/post hook pair, each layer by another pair (its
    time outside its hooked stages is the ``residual`` row: the two residual adds and the
    reshapes between modules), and sampling by its own clock. ``other`` is what no timer
    saw: the step time minus every timed row. The claim checked is that ``other`` is at
    most 10% of the step time, i.e. the rows sum to the step within 10%. It is not true by
    construction: leaving a stage module unhooked (the LM head alone is over a tenth of a
    SmolLM2 decode step) or timing outside the step would break it. Summed over the
    steps, so one preempted step on a shared machine cannot decide it.
    """
    steps = traced.steps
    step_s = sum(s.step_s for s in steps)
    timed_s = sum(v for s in steps for k, v in s.measured.items() if k != "other")
    assert timed_s <= step_s * (1 + 1e-6)
    assert timed_s >= 0.9 * step_s, f"rows cover {timed_s / step_s:.1%} of the step time"
    for s in steps:
        assert sum(s.measured.values()) == pytest.approx(s.step_s, rel=1e-6)


def test_every_stage_module_is_timed(traced):
    expected = set(TOP_STAGES.values()) | (set(LAYER_STAGES.values()) - {"moe_ffn"})
    for step in traced.steps:
        assert expected <= set(step.measured), expected - set(step.measured)
        assert all(v >= 0 for v in step.measured.values())
        assert set(step.measured) <= set(ROW_ORDER)


def test_tracing_leaves_no_hooks_and_does_not_change_the_tokens(loaded, hardware, traced):
    for module in loaded.net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, module
    plain = trace_request(loaded, PROMPT, hardware, max_tokens=MAX_TOKENS, timed=False)
    assert [s.token_id for s in plain.steps] == [s.token_id for s in traced.steps]
    assert set(plain.steps[0].measured) == {"sampling", "other"}


def test_prefill_then_one_token_per_decode_step_with_the_cache_growing(traced, hardware, loaded):
    config = traced.config
    # the packaged Q4_1 file runs quantized: predictions count its bytes, not fp32's
    assert loaded.precision.label == "Q4_1 + Q8_0" and 0.7 < loaded.precision.weight_bytes < 0.73
    steps = traced.steps
    n = len(traced.prompt_ids)
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    assert [s.num_new_tokens for s in steps] == [n] + [1] * (len(steps) - 1)
    assert [s.context_len for s in steps] == list(range(n, n + len(steps)))
    for s in steps:  # the cache in use: the seed's formula at fp32
        assert s.kv_bytes == s.context_len * config.kv_bytes_per_token(4)
        assert s.predicted.time_s == pytest.approx(pass_cost(
            config, hardware, loaded.precision, s.num_new_tokens, s.context_len,
            fused_attention=True).time_s)
    assert 0 < traced.prefill_share < 1


def test_tokens_pieces_and_candidates(traced):
    assert "".join(traced.prompt_pieces).count(PROMPT) == 1  # the pieces spell the prompt
    assert " quadratic" in traced.prompt_pieces
    for step in traced.steps:
        probs = [c.probability for c in step.candidates]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert step.token_id == step.candidates[0].token_id  # greedy draws the top candidate
    assert traced.output_text.strip()


def test_trace_text_and_json(traced):
    text = trace_text(traced)
    for needle in ("prefill: measured", "q_proj", "attention", "residual", "drew", "KV cache",
                   "wall time: prefill"):
        assert needle in text
    data = json.loads(json.dumps(trace_json(traced)))
    assert len(data["steps"]) == len(traced.steps)
    assert data["steps"][0]["stages"][0]["stage"] == "embedding"


def test_stage_timer_on_a_moe_model_times_the_experts_as_one_row():
    import torch

    from inferpath.cache.kv import KVCache
    from inferpath.config import ModelConfig
    from inferpath.explain.hooks import StageTimer
    from inferpath.explain.trace import one_sequence_metadata
    from inferpath.model import Transformer

    config = ModelConfig(architecture="mixtral", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=32)
    model = Transformer(config)
    model.init_random_weights()
    cache = KVCache(config, num_blocks=1, block_size=16)
    with torch.inference_mode(), StageTimer(model) as timer:
        model(torch.arange(5), torch.arange(5), cache, one_sequence_metadata(0, 5, 1))
        rows = timer.take()
    assert "moe_ffn" in rows and "gate_proj" not in rows and rows["moe_ffn"] > 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
