"""Each matmul stage at the rate of its own kernel, in the format it runs (explain/kernel_cost.py).

Against a second path of our own (the formats read from a GGUF index under its weight plan
against those of the loaded model's modules), `gguf.quants.dequantize` (the probe's random
blocks are valid blocks of their format), and figures computed by hand (a Q4_K_M stage of
Q4_K and Q6_K layers at each format's size and rate).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from inferpath import LLM
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import HARDWARE_PRESETS
from inferpath.explain.kernel_cost import gemv_shapes
from inferpath.explain.stage_formats import MatrixRun, bytes_per_value, formats_of_model, formats_of_plan
from inferpath.models import resolve_model

H100 = HARDWARE_PRESETS["h100-sxm"]


@pytest.fixture(scope="module")
def smollm2():
    return LLM("smollm2-135m-instruct", max_num_seqs=2)


def test_plan_and_model_agree_on_each_stage_format(smollm2):
    engine = smollm2.engine
    from_model = formats_of_model(engine.runner.model, engine.model_config)
    from_plan = formats_of_plan(resolve_model("smollm2-135m-instruct"), engine.weight_plan, engine.model_config)
    assert from_model == from_plan
    runs = dict(from_model)
    # SmolLM2's file: Q4_1 layers, its tied Q8_0 embedding as the head; Q, K and V one fused call
    assert runs["lm_head"] == (MatrixRun("Q8_0", 49_152, 576, 49_152, 1),)
    assert runs["k_proj"] == (MatrixRun("Q4_1", 192, 576, 576 + 2 * 192, 30),)
    assert runs["gate_proj"] == (MatrixRun("Q4_1", 1536, 576, 2 * 1536, 30),)


def test_a_stage_is_priced_at_its_formats_sizes_and_rates_by_hand():
    """A 1.5B Q4_K_M v_proj: 14 layers Q4_K, 14 Q6_K, each read at its own GEMV rate."""
    from inferpath.explain.presets import resolve_model_config

    config = dataclasses.replace(resolve_model_config("llama-3-8b"), num_layers=28)
    v = (MatrixRun("Q4_K", 1024, 4096, 6144, 14), MatrixRun("Q6_K", 1024, 4096, 6144, 14))
    precision = Precision("fp32", 0.6, "Q4_K + Q6_K").with_formats((("v_proj", v),))
    rates = {"Q4_K/float32/6144x4096": 10e9, "Q6_K/float32": 20e9}  # a shape's rate; a format's only
    machine = dataclasses.replace(H100, name="machine", gemv_rates=rates, gemm_rates={"Q4_K/float32": 1e12})
    stage = pass_cost(config, machine, precision, 1, 50).stage("v_proj")
    q4k, q6k = 14 * 1024 * 4096 * 144 / 256, 14 * 1024 * 4096 * 210 / 256
    assert stage.weight_bytes == pytest.approx(q4k + q6k)
    activations = 4096 * 4 + 1024 * 4  # x read, y written, float32
    assert stage.memory_time_s == pytest.approx(q4k / 10e9 + q6k / 20e9 + 28 * activations / H100.memory_bandwidth)
    assert stage.bound == "memory" and stage.time_s == stage.memory_time_s  # one row: the GEMV's time
    # on a preset (no kernel rates) only the bytes change
    preset = pass_cost(config, H100, precision, 1, 50).stage("v_proj")
    assert preset.weight_bytes == pytest.approx(q4k + q6k)
    assert preset.memory_time_s == pytest.approx((q4k + q6k + 28 * activations) / H100.memory_bandwidth)
    # an untouched stage keeps the mean bytes
    assert pass_cost(config, machine, precision, 1, 50).stage("o_proj").weight_bytes == pytest.approx(
        28 * 4096 * 4096 * 0.6)


def test_experts_are_priced_at_the_share_the_pass_reads():
    from inferpath.explain.presets import resolve_model_config

    config = resolve_model_config("mixtral-8x7b")  # 8 experts, top-2
    runs = (MatrixRun("Q4_K", 8 * config.intermediate_size, config.hidden_size, 8 * config.intermediate_size,
                      config.num_layers),)
    precision = Precision("fp32", 0.5625, "Q4_K").with_formats((("up_proj", runs),))
    stage = pass_cost(config, H100, precision, 1, 20).stage("up_proj")
    assert stage.weight_bytes == pytest.approx(config.num_layers * 2 * config.intermediate_size
                                               * config.hidden_size * 144 / 256)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_the_probes_random_blocks_are_valid_blocks(fmt):
    from inferpath.explain.probe_kernels import random_blocks

    weight = random_blocks(fmt, 8, 512)
    values = quants.dequantize(weight.data.numpy(), GGMLQuantizationType[fmt])
    assert values.shape == (8, 512) and np.isfinite(values).all() and np.abs(values).max() > 0
    assert weight.nbytes == 8 * 512 * bytes_per_value(fmt)


def test_shape_rates_are_measured_once_and_kept_beside_the_probe(monkeypatch, tmp_path, smollm2):
    from inferpath.explain import probe, probe_kernels
    from inferpath.explain.trace import precision_of

    path = tmp_path / "probe.json"
    _, _, key = probe.cached_entry(cache_path=path)
    path.write_text(json.dumps({key: {"read_bandwidth": 1e10}}))
    measured = []
    monkeypatch.setattr(probe_kernels, "measure_gemv_key", lambda k: measured.append(k) or 5e9)
    monkeypatch.setattr(probe_kernels, "busy", lambda: False)
    keys = gemv_shapes(precision_of(smollm2.engine))
    assert "Q4_1/float32/3072x576" in keys and "Q8_0/float32/49152x576" in keys
    machine = dataclasses.replace(H100, name="this-machine")
    first = probe_kernels.with_gemv_shapes(machine, keys, cache_path=path)
    assert sorted(measured) == keys and all(first.gemv_rates[k] == 5e9 for k in keys)
    again = probe_kernels.with_gemv_shapes(machine, keys, cache_path=path)
    assert len(measured) == len(keys) and again.gemv_rates == first.gemv_rates  # from the cache
    assert probe_kernels.with_gemv_shapes(H100, keys, cache_path=path) is H100  # presets: nothing measured
    monkeypatch.setattr(probe_kernels, "busy", lambda: True)  # measured on a busy machine: used, not kept
    busy = probe_kernels.with_gemv_shapes(machine, ["Q4_K/float32/256x512"], cache_path=path)
    assert busy.gemv_rates["Q4_K/float32/256x512"] == 5e9
    assert "Q4_K/float32/256x512" not in json.loads(path.read_text())[key]["shape_gemv"]


def test_a_small_gemv_measures_a_positive_rate(monkeypatch):
    from inferpath.explain import probe_kernels

    monkeypatch.setattr(probe_kernels, "GEMV_BYTES", 1 << 20)
    monkeypatch.setattr(probe_kernels, "REPEATS", 1)
    assert probe_kernels.measure_gemv("Q4_K", "float32", 256, 512) > 0
    assert probe_kernels.measure_gemv("F32", "float32", 256, 512) > 0
    assert probe_kernels.measure_module_call() > 0


def test_the_trace_says_which_path_it_measured_and_prices_module_calls(smollm2):
    from inferpath import SamplingParams
    from inferpath.engine.trace import trace
    from inferpath.explain.trace import request_trace

    machine = dataclasses.replace(H100, module_call_s=1e-5)
    with trace(smollm2.engine) as tracer:
        (out,) = smollm2.generate("The capital of France is", SamplingParams(max_tokens=3, temperature=0,
                                                                            ignore_eos=True))
    view = request_trace(tracer, out.request_id, smollm2.engine, machine)
    layers = smollm2.engine.model_config.num_layers
    for step in view["steps"]:
        native = step["path"] == "native"
        for row in step["stages"]:
            if row["predicted_s"] is not None:
                # the rows around the native call are module calls on both paths; the sampler's
                # own call is in its measured price, never a module call (test_explain_paths.py)
                once = row["stage"] in ("embedding", "final_norm", "lm_head")
                calls = 0.0 if row["stage"] == "sampling" else 1e-5 * (1 if once else 0 if native else layers)
                assert row["calls_s"] == pytest.approx(calls)
                assert row["predicted_s"] == pytest.approx(row["kernel_s"] + calls)
    assert view["decode_path"] in ("native", "module", "native + module")


def test_the_cache_rule_prices_a_step_that_fits_at_the_resident_rate_by_hand():
    """A step whose hot data fits in half the last-level cache reads its matrices at the
    resident rate of their shape; a larger one, or the same without a known cache, streams."""
    from inferpath.explain.kernel_cost import CACHE_SHARE, hot_bytes
    from inferpath.explain.presets import resolve_model_config

    config = dataclasses.replace(resolve_model_config("llama-3-8b"), num_layers=2)
    v = (MatrixRun("Q4_K", 1024, 4096, 6144, 2),)
    precision = Precision("fp32", 0.6, "Q4_K").with_formats((("v_proj", v),))
    rates = {"Q4_K/float32/6144x4096": 10e9, "Q4_K/float32/6144x4096/resident": 40e9}
    q4k = 2 * 1024 * 4096 * 144 / 256
    streamed = dataclasses.replace(H100, name="machine", gemv_rates=rates, gemm_rates={"Q4_K/float32": 1e12})
    hot = hot_bytes(pass_cost(config, streamed, precision, 1, 50).stages)
    activations = 2 * (4096 * 4 + 1024 * 4) / H100.memory_bandwidth

    def v_time(cache_bytes):
        machine = dataclasses.replace(streamed, cache_bytes=cache_bytes)
        return pass_cost(config, machine, precision, 1, 50).stage("v_proj").memory_time_s

    assert v_time(0.0) == pytest.approx(q4k / 10e9 + activations)  # no cache known: streamed
    assert v_time(hot / CACHE_SHARE * 0.99) == pytest.approx(q4k / 10e9 + activations)  # just too large
    assert v_time(hot / CACHE_SHARE * 1.01) == pytest.approx(q4k / 40e9 + activations)  # fits: resident
    # the shapes the probe measures for a model: each streamed and resident
    assert gemv_shapes(precision) == ["Q4_K/float32/6144x4096", "Q4_K/float32/6144x4096/resident"]


def test_resident_and_streamed_gemvs_are_measured_apart(monkeypatch):
    from inferpath.explain import probe_kernels

    monkeypatch.setattr(probe_kernels, "GEMV_BYTES", 1 << 20)
    monkeypatch.setattr(probe_kernels, "REPEATS", 1)
    monkeypatch.setattr(probe_kernels, "llc_bytes", lambda: 1 << 20)
    assert probe_kernels.measure_gemv_key("Q4_K/float32/256x512/resident") > 0
    assert probe_kernels.measure_gemv_key("Q4_K/float32/256x512") > 0
    assert probe_kernels.llc_bytes() == 1 << 20
