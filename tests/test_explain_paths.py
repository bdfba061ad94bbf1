"""What a step pays depends on the path that ran it, and the sampler is priced by running it.

explain/kernel_cost.py prices a native decode step's layer matmuls at the native step's own
GEMV rates (``".../native"``, probed through decode.c's matmul) and a module-path step's at
the module's; explain/trace.py adds a module call only to the rows that are module calls on
the step's path; explain/sampler_cost.py prices the ``sampling`` stage at the measured cost of
the engine's sampler. Against figures computed by hand, the cost model's own ``pass_cost``
(what ``explain`` prints) on a preset, and the engine's sampler itself.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from inferpath import LLM, SamplingParams
from inferpath.engine.trace import trace
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import HARDWARE_PRESETS
from inferpath.explain.kernel_cost import NATIVE_STAGES, gemv_shapes
from inferpath.explain.sampler_cost import price_sampling, row_kind, sampler_key
from inferpath.explain.stage_formats import MatrixRun
from inferpath.explain.trace import AROUND_NATIVE, request_trace, step_cost

H100 = HARDWARE_PRESETS["h100-sxm"]


@pytest.fixture(scope="module")
def smollm2():
    return LLM("smollm2-135m-instruct", max_num_seqs=2)


def _two_layer_q4k():
    from inferpath.explain.presets import resolve_model_config

    config = dataclasses.replace(resolve_model_config("llama-3-8b"), num_layers=2, vocab_size=4096)
    o = (MatrixRun("Q4_K", 4096, 4096, 4096, 2),)
    head = (MatrixRun("Q6_K", 4096, 4096, 4096, 1),)
    precision = Precision("fp32", 0.6, "Q4_K + Q6_K").with_formats((("o_proj", o), ("lm_head", head)))
    return config, precision


def test_a_native_step_prices_layer_matmuls_at_the_native_rate_and_the_head_at_the_module_rate():
    config, precision = _two_layer_q4k()
    rates = {"Q4_K/float32/4096x4096": 10e9, "Q4_K/float32/4096x4096/native": 25e9,
             "Q6_K/float32/4096x4096": 8e9, "Q6_K/float32/4096x4096/native": 30e9}
    machine = dataclasses.replace(H100, name="machine", gemv_rates=rates, gemm_rates={"Q4_K/float32": 1e12})
    o_bytes, head_bytes = 2 * 4096 * 4096 * 144 / 256, 4096 * 4096 * 210 / 256
    o_activations = 2 * (4096 * 4 + 4096 * 4) / H100.memory_bandwidth  # x read, y written, float32

    module = step_cost(config, machine, precision, [(1, 50, True)])
    native = step_cost(config, machine, precision, [(1, 50, True)], native=True)
    assert module.stage("o_proj").memory_time_s == pytest.approx(o_bytes / 10e9 + o_activations)
    assert native.stage("o_proj").memory_time_s == pytest.approx(o_bytes / 25e9 + o_activations)
    # the LM head runs after the native call as a module: its module rate on both paths
    assert "lm_head" not in NATIVE_STAGES
    assert native.stage("lm_head").time_s == pytest.approx(module.stage("lm_head").time_s)
    assert native.stage("lm_head").memory_time_s > head_bytes / 8e9
    # a shape without a native rate falls back to its module rate
    machine_without = dataclasses.replace(machine, gemv_rates={"Q4_K/float32/4096x4096": 10e9})
    fallback = step_cost(config, machine_without, precision, [(1, 50, True)], native=True)
    assert fallback.stage("o_proj").memory_time_s == pytest.approx(o_bytes / 10e9 + o_activations)
    # the probe measures native shapes only for the stages the native call runs
    assert gemv_shapes(precision, native=True) == [
        "Q4_K/float32/4096x4096", "Q4_K/float32/4096x4096/native", "Q4_K/float32/4096x4096/native/resident",
        "Q4_K/float32/4096x4096/resident", "Q6_K/float32/4096x4096", "Q6_K/float32/4096x4096/resident"]
    assert gemv_shapes(precision) == [k for k in gemv_shapes(precision, native=True) if "/native" not in k]


def test_on_a_preset_the_path_changes_nothing_and_the_step_is_explains_pass():
    """A preset has no kernel rates and no sampler figure: a native step, a module step and
    ``explain``'s ``pass_cost`` of the same shapes and tokens are the same numbers."""
    config, precision = _two_layer_q4k()
    explained = pass_cost(config, H100, precision, 1, 50, fused_attention=True)
    for native in (False, True):
        step = step_cost(config, H100, precision, [(1, 50, True)], native=native,
                         sampler=sampler_key(config.vocab_size, ["greedy"]))
        assert [s.name for s in step.stages] == [s.name for s in explained.stages]
        for ours, theirs in zip(step.stages, explained.stages):
            assert ours.time_s == pytest.approx(theirs.time_s) and ours.bytes_moved == pytest.approx(theirs.bytes_moved)


def test_sampler_keys_describe_the_rows_work():
    assert row_kind(SamplingParams(temperature=0)) == "greedy"
    assert row_kind(SamplingParams(temperature=0.7, top_p=0.9, logprobs=2)) == "sample+top_p+logprobs"
    assert row_kind(SamplingParams(temperature=1.0, top_k=5, min_p=0.1, repetition_penalty=1.2)) == \
        "sample+top_k+min_p+penalties"
    assert sampler_key(49152, ["greedy", "sample", "greedy"]) == "49152/greedy:2,sample:1"
    assert sampler_key(49152, []) is None and sampler_key(49152, ["greedy", "grammar"]) is None


def test_the_sampler_probe_runs_the_engines_sampler(monkeypatch):
    from inferpath.explain import sampler_cost
    from inferpath.sampling import sampler as sampler_module

    calls = []
    original = sampler_module.Sampler.__call__

    def counting(self, logits, rows):
        calls.append((tuple(logits.shape), [r.params.is_greedy for r in rows], [r.params.top_p for r in rows]))
        return original(self, logits, rows)

    monkeypatch.setattr(sampler_module.Sampler, "__call__", counting)
    monkeypatch.setattr(sampler_cost, "REPEATS", 2)
    seconds = sampler_cost.measure_sampler("1000/greedy:1,sample+top_p:2")
    assert seconds > 0
    assert len(calls) == 3  # a warm-up and the repeats, each over every row of the key
    assert all(shape == (3, 1000) for shape, _, _ in calls)
    assert sorted(calls[0][1]) == [False, False, True] and 0.9 in calls[0][2]


def test_the_sampling_stage_takes_the_measured_price_where_the_machine_has_it():
    config, precision = _two_layer_q4k()
    key = sampler_key(config.vocab_size, ["greedy"])
    machine = dataclasses.replace(H100, name="machine", sampler_s={key: 3e-4})
    roofline = step_cost(config, machine, precision, [(1, 50, True)]).stage("sampling")
    priced = step_cost(config, machine, precision, [(1, 50, True)], sampler=key).stage("sampling")
    assert priced.time_s == pytest.approx(3e-4) and roofline.time_s < 1e-6
    assert priced.bytes_moved == roofline.bytes_moved and priced.flops == roofline.flops  # what it counts stays
    assert price_sampling(roofline, "4096/sample:1", machine) is roofline  # not measured: the roofline


def test_a_trace_prices_module_calls_by_path_and_the_sampler_as_measured(smollm2):
    engine = smollm2.engine
    key = sampler_key(engine.model_config.vocab_size, ["greedy"])
    machine = dataclasses.replace(H100, module_call_s=1e-5, sampler_s={key: 2.5e-4})
    with trace(engine) as tracer:
        (out,) = smollm2.generate("The capital of France is", SamplingParams(max_tokens=3, temperature=0,
                                                                            ignore_eos=True))
    records = tracer.steps_of(out.request_id)
    assert all(c.sampling_kind == "greedy" for r in records for c in r.chunks)
    view = json.loads(json.dumps(request_trace(tracer, out.request_id, engine, machine)))
    layers = engine.model_config.num_layers
    for step in view["steps"]:
        native = step["path"] == "native"
        rows = {r["stage"]: r for r in step["stages"]}
        assert rows["sampling"]["predicted_s"] == pytest.approx(2.5e-4) and rows["sampling"]["calls_s"] == 0.0
        for name, row in rows.items():
            if row["predicted_s"] is None or name == "sampling":
                continue
            if native:
                calls = 1e-5 if name in AROUND_NATIVE else 0.0
            else:
                calls = 1e-5 * (1 if name in AROUND_NATIVE else layers)
            assert row["calls_s"] == pytest.approx(calls), (step["path"], name)
            assert row["predicted_s"] == pytest.approx(row["kernel_s"] + calls)


def test_the_native_gemv_probe_times_the_native_steps_matmul(monkeypatch):
    from inferpath.explain import probe_kernels
    from inferpath.kernels import build

    monkeypatch.setattr(probe_kernels, "GEMV_BYTES", 1 << 20)
    monkeypatch.setattr(probe_kernels, "REPEATS", 1)
    if build.native_decode_matmuls("quantized") is None:
        assert probe_kernels.measure_native_gemv("Q4_K", "float32", 256, 512) is None
        return
    assert probe_kernels.measure_gemv_key("Q4_K/float32/256x512/native") > 0
    assert probe_kernels.measure_gemv_key("Q4_1/float32/256x512/native/resident") > 0
    assert probe_kernels.measure_native_gemv("F32", "float32", 256, 512) > 0


def test_the_native_probes_matmul_is_the_module_paths_result():
    """inferpath_decode_matmuls computes what QuantLinear does for the same weight and row
    (the same kernel through the step's pool): a probe of the wrong computation cannot pass."""
    import ctypes

    from inferpath.explain.probe_kernels import random_blocks
    from inferpath.kernels import build
    from inferpath.kernels.quantized import QuantLinear

    fn = build.native_decode_matmuls("quantized")
    if fn is None or build.native_quant_matmul() is None:
        pytest.skip("no native quantized kernels here")
    weight = random_blocks("Q4_1", 96, 256)
    linear = QuantLinear(weight)
    x = torch.randn(1, 256)
    pointers = (ctypes.c_void_p * 2)(weight.data.data_ptr(), weight.data.data_ptr())
    y = torch.full((1, 96), float("nan"))
    assert fn(2, int(weight.qtype), pointers, weight.data.shape[1], 96, x.data_ptr(), y.data_ptr(), 1, 256,
              torch.get_num_threads(), 0, 0) == 0
    with torch.inference_mode():
        expected = linear(x)
    assert torch.equal(y, expected)


def test_the_attention_probe_runs_the_paged_kernel_hot_and_cold(monkeypatch):
    """explain/attention_cost.py: the engine's paged decode kernel at a key's shape, a fixed
    part (never negative) and a per-token part (positive), hot and cold (every call over blocks
    not read before); no native kernel, no figure. Which of hot and cold costs more is a
    measurement of the machine, not asserted: on a shared 2-core VM cold came out 0.6% under
    hot once, and a fit's fixed part came out 0 under load once."""
    from inferpath.explain import attention_cost
    from inferpath.kernels import build

    monkeypatch.setattr(attention_cost, "ROUNDS", 2)
    key = attention_cost.attention_key(9, 3, 64, "float32", 16)
    if build.native_paged_attention(torch.float32) is None:
        assert attention_cost.measure_attention(key) is None
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    (fixed, per_token), (_, cold_per_token) = (attention_cost.measure_attention(k)
                                               for k in attention_cost.probed_keys(key))
    assert 0 <= fixed < 1e-3 and 0 < per_token < 1e-5
    assert 0 < cold_per_token < 1e-5


def test_a_decode_steps_attention_takes_the_measured_price_where_the_machine_has_it():
    """Per layer and decode row: the fixed part plus the per-token part over the row's context
    (split over the threads where the kernel splits); never below the roofline; a prefill
    step, an unmeasured key and a preset keep the roofline."""
    import inferpath.explain.attention_cost as attention_cost

    config, precision = _two_layer_q4k()
    key = attention_cost.attention_key(config.num_heads, config.num_kv_heads, config.head_dim, "float32", 16)
    machine = dataclasses.replace(H100, name="machine", attention_s={key: (2e-6, 1e-8), f"{key}/cold": (3e-6, 2e-8)})
    names = attention_cost.ATTENTION_STAGES

    def attention_s(chunks, **kw):
        cost = step_cost(config, machine, precision, chunks, **kw)
        return sum(cost.stage(n).time_s for n in names), cost

    roofline, plain = attention_s([(1, 3, True), (1, 5, True)])
    priced, cost = attention_s([(1, 3, True), (1, 5, True)], attention=key)
    # the cold figure: the step's 4096-wide Q4_K weights do not stay in a cache of 0 bytes;
    # 2 rows x 32 heads x 128 x 5 positions: under either threshold, one thread
    assert priced == pytest.approx(config.num_layers * (2 * 3e-6 + 2e-8 * (3 + 5)))
    assert priced > roofline
    threads = torch.get_num_threads()  # 4096 x 4000 positions: split over the threads on either path
    for native in (False, True):
        assert attention_s([(1, 4000, True)], attention=key, native=native)[0] == \
            pytest.approx(config.num_layers * (3e-6 + 2e-8 * 4000 / threads))
    for n in names:  # bytes and FLOPs kept, the time shared as the rooflines shared it
        assert cost.stage(n).bytes_moved == plain.stage(n).bytes_moved
        assert cost.stage(n).time_s / priced == pytest.approx(plain.stage(n).time_s / roofline)
    assert attention_s([(8, 50, True)], attention=key)[0] == attention_s([(8, 50, True)])[0]  # a prefill step
    assert attention_s([(1, 50, True)], attention="1x1x1/float32/16")[0] == attention_s([(1, 50, True)])[0]
    assert attention_cost.with_attention_costs(H100, [key]) is H100
    slow = dataclasses.replace(machine, attention_s={key: (1e-12, 0.0), f"{key}/cold": (1e-12, 0.0)})
    assert sum(step_cost(config, slow, precision, [(1, 50, True)], attention=key).stage(n).time_s
               for n in names) == pytest.approx(attention_s([(1, 50, True)])[0])  # never below the roofline


def test_the_attention_figures_are_cached_beside_the_probe(tmp_path, monkeypatch):
    """Measured once, stored under the probe's entry ("attention_s", as lists), read back as
    (fixed, per-token) without measuring; not stored when the machine is busy; a refresh
    measures again."""
    import json

    import inferpath.explain.attention_cost as attention_cost
    from inferpath.explain import probe, probe_kernels
    from inferpath.explain.hardware import THIS_MACHINE

    path = tmp_path / "probe.json"
    _, _, entry = probe.cached_entry(cache_path=path)
    path.write_text(json.dumps({entry: {}}))
    calls = []
    monkeypatch.setattr(attention_cost, "measure_attention", lambda key: calls.append(key) or (2e-6, 3e-8))
    monkeypatch.setattr(probe_kernels, "busy", lambda: False)
    here = dataclasses.replace(H100, name=THIS_MACHINE)
    keys = attention_cost.probed_keys("4x2x64/float32/16")
    measured = attention_cost.with_attention_costs(here, keys, cache_path=path)
    assert measured.attention_s == dict.fromkeys(keys, (2e-6, 3e-8)) and calls == keys
    assert json.loads(path.read_text())[entry]["attention_s"] == dict.fromkeys(keys, [2e-6, 3e-8])
    again = attention_cost.with_attention_costs(here, keys, cache_path=path, measure=False)
    assert again.attention_s == measured.attention_s and len(calls) == 2  # from the cache
    attention_cost.with_attention_costs(here, keys, refresh=True, cache_path=path)
    assert len(calls) == 4
    monkeypatch.setattr(probe_kernels, "busy", lambda: True)
    other = attention_cost.probed_keys("8x8x128/float32/16")
    attention_cost.with_attention_costs(here, other, cache_path=path)
    assert not set(other) & set(json.loads(path.read_text())[entry]["attention_s"])  # busy: used, not kept
