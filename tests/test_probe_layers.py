"""The native shapes' rates come from layers' matrices streamed in sequence (explain/probe_layers.py):
structural checks, no timing."""

import pytest

from inferpath.explain import probe_kernels, probe_layers
from inferpath.explain.cost import Precision
from inferpath.explain.kernel_cost import gemv_shapes, rate_format
from inferpath.explain.stage_formats import MatrixRun

KEYS = ["Q4_K/float32/2048x1536/native", "Q6_K/float32/1536x8960/native", "Q4_K/float32/1536x1536/native"]


@pytest.mark.parametrize("cache", [1 << 20, 105 << 20, 3 * 105 << 20])
def test_a_formats_rate_is_taken_from_a_sequence_larger_than_the_cache(cache):
    layer, count = probe_layers.plan_layers(KEYS, cache)
    assert [s.key for s in layer] == KEYS  # every shape in each layer, in the step's order
    assert count * sum(s.bytes for s in layer) > cache
    assert (count - 1) * sum(s.bytes for s in layer) <= cache  # the fewest layers that pass it


def test_the_sequence_passes_three_caches_by_default(monkeypatch):
    monkeypatch.setattr(probe_kernels, "llc_bytes", lambda: 105 << 20)
    layer, count = probe_layers.plan_layers(KEYS, probe_kernels.streamed_bytes())
    assert count * sum(s.bytes for s in layer) > 3 * (105 << 20)


def test_only_streamed_native_keys_make_a_sequence():
    with pytest.raises(ValueError, match="not a streamed native shape key"):
        probe_layers.plan_layers(["Q4_K/float32/256x512/native/resident"], 1 << 20)


def test_the_native_shapes_are_measured_together_as_one_layer(monkeypatch, tmp_path):
    from inferpath.explain.hardware import THIS_MACHINE, HardwareSpec

    sequences, singles = [], []
    monkeypatch.setattr(probe_layers, "measure_layer_sequence",
                        lambda keys: sequences.append(list(keys)) or {k: 7e9 for k in keys})
    monkeypatch.setattr(probe_kernels, "measure_gemv_key", lambda k: singles.append(k) or 5e9)
    machine = HardwareSpec(name=THIS_MACHINE, memory_bandwidth=1e10, peak_flops={"fp32": 1e11}, memory_bytes=1e9)
    keys = KEYS + ["Q4_K/float32/2048x1536", "Q4_K/float32/2048x1536/native/resident"]
    out = probe_kernels.with_gemv_shapes(machine, keys, cache_path=tmp_path / "probe.json")
    assert sequences == [KEYS]
    assert sorted(singles) == sorted(keys[3:])
    assert all(out.gemv_rates[k] == 7e9 for k in KEYS)


def test_a_repacked_layer_matrix_is_keyed_and_probed_repacked():
    run = MatrixRun("Q4_K", 1536, 1536, 1536, 28)
    assert rate_format(run, "o_proj", ("Q4_K", "Q6_K")) == "Q4_K_R8"
    assert rate_format(run, "o_proj") == "Q4_K"
    assert rate_format(run, "lm_head", ("Q4_K",)) == "Q4_K"  # not a layer matrix
    assert rate_format(MatrixRun("Q4_K", 1536, 100, 1536, 1), "o_proj", ("Q4_K",)) == "Q4_K"  # r8.c refuses it
    precision = Precision("fp32", 0.6, "Q4_K", repacked=("Q4_K",)).with_formats((("o_proj", (run,)),))
    assert "Q4_K_R8/float32/1536x1536/native" in gemv_shapes(precision, native=True)
    assert probe_kernels.file_format("Q4_K_R8") == ("Q4_K", True)
    assert probe_kernels._bytes_per_value("Q4_K_R8") == 144 / 256  # counted as the cost model counts it


def test_the_probe_builds_a_repacked_weight_for_an_r8_format():
    from inferpath.kernels import build

    if build.native_quant_repack() is None:
        pytest.skip(f"no native kernels: {build.kernel_status()}")
    linear = probe_kernels._linear("Q4_K_R8", 16, 256)
    assert getattr(linear.qweight, "repacked", False)
    assert probe_kernels._weight_bytes(linear) == 16 * 256 * 144 / 256
    assert not getattr(probe_kernels._linear("Q4_K", 16, 256).qweight, "repacked", False)


def test_the_sequence_measures_every_shape_it_can(monkeypatch):
    from inferpath.kernels import build

    if build.native_decode_matmuls("quantized") is None:
        assert probe_layers.measure_layer_sequence(["Q4_K/float32/256x512/native"], 1 << 18, 1) == {}
        return
    rates = probe_layers.measure_layer_sequence(["Q4_K/float32/256x512/native", "Q8_0/float32/64x512/native"],
                                                1 << 18, rounds=1)
    assert set(rates) == {"Q4_K/float32/256x512/native", "Q8_0/float32/64x512/native"}
    assert all(r > 0 for r in rates.values())
