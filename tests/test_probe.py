"""The this-machine probe: keyed by what changes it, measured through the engine's linear,
and a slow dtype reported as slow (a small positive ridge, compute-bound), never ridge 0."""

from __future__ import annotations

import json

import pytest

from inferpath.cli import main
from inferpath.explain import probe
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.presets import resolve_model_config

SMALL = dict(bandwidth_bytes=4 * 2**20, matmul_n=64)

# An AVX2 machine without native bf16: fp32 GEMM at 60 GFLOP/s, bf16 at 0.6 (the figure)
SLOW_BF16 = {
    "device": "cpu", "read_bandwidth": 20e9, "copy_bandwidth": 18e9, "fp32_flops": 60e9,
    "bf16_flops": 0.6e9, "fp32_gemv_bandwidth": 15e9, "bf16_gemv_bandwidth": 1e9,
    "memory_bytes": 16e9, "bandwidth_bytes": SMALL["bandwidth_bytes"], "matmul_n": SMALL["matmul_n"],
    "load_average": 0.0, "cpus": 2,
}


def test_the_cache_key_changes_with_the_kernel_level(monkeypatch):
    monkeypatch.delenv("INFERPATH_ISA", raising=False)
    detected = probe.kernel_level()
    key = probe.probe_key("cpu", 2, **SMALL)
    assert f"isa-{detected}" in key and "torch-" in key and probe.cpu_model() in key
    lower = [level for level in ("avx2", "generic") if level != detected]  # an AVX2-only CPU detects avx2
    assert lower
    for level in lower:
        monkeypatch.setenv("INFERPATH_ISA", level)
        assert probe.kernel_level() == level
        assert probe.probe_key("cpu", 2, **SMALL) != key
    monkeypatch.setenv("INFERPATH_ISA", "avx2")
    avx2 = probe.probe_key("cpu", 2, **SMALL)
    assert avx2 == probe.probe_key("cpu", 2, **SMALL) and "isa-avx2" in avx2


def test_the_cache_key_changes_with_the_kernels_build(monkeypatch):
    """New kernel sources (another library build) are measured anew, not read from the cache."""
    from inferpath.kernels import build

    key = probe.probe_key("cpu", 2, **SMALL)
    assert f"kernels-{build.library_build()}" in key
    monkeypatch.setattr(build, "library_build", lambda level=None: "another-build")
    assert probe.probe_key("cpu", 2, **SMALL) != key


def test_a_forced_kernel_level_is_measured_and_cached_apart(tmp_path, monkeypatch):
    path = tmp_path / "probe.json"
    calls = []
    monkeypatch.setattr(probe, "measure", lambda *a: calls.append(a) or dict(SLOW_BF16))
    monkeypatch.setenv("INFERPATH_ISA", "avx2")
    probe.probe_this_machine(cache_path=path, **SMALL)
    probe.probe_this_machine(cache_path=path, **SMALL)
    monkeypatch.setenv("INFERPATH_ISA", "generic")
    probe.probe_this_machine(cache_path=path, **SMALL)
    assert len(calls) == 2
    cached = json.loads(path.read_text())
    assert {m["kernel_level"] for m in cached.values()} == {"avx2", "generic"}
    probe.probe_this_machine(cache_path=path, refresh=True, **SMALL)  # --reprobe
    assert len(calls) == 3


def test_bf16_slower_than_fp32_gives_a_positive_ridge_and_compute_bound_decode():
    spec = probe.spec_from_measurement(SLOW_BF16)
    ridge = spec.ridge_point("bf16")
    assert ridge == pytest.approx(0.6e9 / 20e9) and ridge > 0
    assert spec.ridge_point("fp32") == pytest.approx(3.0)
    config = resolve_model_config("smollm2-135m")
    bf16 = pass_cost(config, spec, Precision("bf16"), 1, 100)
    fp32 = pass_cost(config, spec, Precision("fp32"), 1, 100)
    # bf16 weights are half the bytes, but this machine multiplies them 100x slower
    assert bf16.bound == "compute" and fp32.bound == "memory"
    assert bf16.time_s > fp32.time_s
    assert bf16.stage("down_proj").bound == "compute" and fp32.stage("down_proj").bound == "memory"


def test_explain_on_such_a_machine_prints_the_ridge_not_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INFERPATH_CACHE", str(tmp_path))
    monkeypatch.setattr(probe, "measure", lambda *a: dict(SLOW_BF16))
    assert main(["explain", "--model", "smollm2-135m", "--hardware", "this-machine", "--reprobe",
                 "--prompt-tokens", "7", "--output-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "ridge 0.03 FLOP/byte" in out and "ridge 0 FLOP" not in out
    assert "decode is compute-bound" in out


def test_a_zero_rate_is_refused():
    with pytest.raises(ValueError, match="bf16_flops=0"):
        probe.spec_from_measurement({**SLOW_BF16, "bf16_flops": 0})


def test_the_real_probe_measures_the_engines_linear(tmp_path):
    spec = probe.probe_this_machine(cache_path=tmp_path / "probe.json", **SMALL)
    assert spec.flops_for("fp32") > 0 and spec.flops_for("bf16") > 0 and spec.memory_bandwidth > 0
    assert "fp32 GEMV" in spec.source and f"kernels {probe.kernel_level()}" in spec.source
    # the quantized kernels a GGUF runs on are measured too, and the cost model uses them
    assert spec.flops_for("quantized") > 0 and "Q8_0 GEMM" in spec.source and "q4_k GEMV" in spec.source


def test_a_quantized_file_is_costed_at_the_quantized_rate():
    from inferpath.explain.hardware import get_hardware
    from inferpath.models import resolve_model

    precision = Precision.of_gguf(resolve_model("smollm2-135m-instruct"))
    assert precision.compute_dtype == "quantized"
    spec = probe.spec_from_measurement({**SLOW_BF16, "q8_0_flops": 9e9, "q4_k_flops": 12e9})
    assert spec.flops_for("quantized") == 9e9  # the slower of the measured block formats
    h100 = get_hardware("h100-sxm")  # a preset: weight-only quantization computes in bf16
    assert h100.flops_for("quantized") == h100.flops_for("bf16")


def _quiet(**extra):
    return {**SLOW_BF16, "load_average": 0.1, "cpus": 2, **extra}


def test_a_probe_beaten_by_a_real_step_is_raised_then_measured_again(tmp_path, monkeypatch):
    """A fake probe with an impossibly low bandwidth: the first decode step that reads faster
    marks it stale and raises its floor (no fraction above 100%); the next use measures again
    and keeps the attained rate as the floor's lower bound."""
    import torch

    path = tmp_path / "probe.json"
    low = _quiet(read_bandwidth=1e9)  # 1 GB/s: any real decode step beats it
    fresh = _quiet()  # 20 GB/s
    measurements = iter([low, fresh])
    monkeypatch.setattr(probe, "measure", lambda *a: dict(next(measurements)))
    monkeypatch.setattr(probe, "load_now", lambda: 0.1)
    sizes = dict(bandwidth_bytes=probe.DEFAULT_BANDWIDTH_BYTES, matmul_n=probe.DEFAULT_MATMUL_N)
    assert probe.probe_this_machine(cache_path=path, **sizes).memory_bandwidth == 1e9
    assert probe.probe_this_machine(cache_path=path, **sizes).memory_bandwidth == 1e9  # cached
    assert not probe.note_observed(0.5e9, cache_path=path)  # slower than the floor: nothing to say
    assert probe.note_observed(25e9, cache_path=path)
    (entry,) = json.loads(path.read_text()).values()
    assert entry["stale"] and entry["observed_read_bandwidth"] == 25e9
    assert probe.reprobe_reason(entry, 0.1).startswith("a decode step read 25.0 GB/s")
    stale = probe.spec_from_measurement(entry)
    assert stale.memory_bandwidth == 25e9 and "floor raised to 25.0 GB/s" in stale.source
    spec = probe.probe_this_machine(cache_path=path, **sizes)  # measured again: fresh (20 GB/s)
    assert spec.memory_bandwidth == 25e9 and "stale" not in spec.source  # the attained rate bounds it
    (entry,) = json.loads(path.read_text()).values()
    assert not entry.get("stale") and entry["read_bandwidth"] == 20e9
    assert torch.get_num_threads() == entry["threads"]


def test_a_probe_taken_under_load_is_taken_again_once_the_machine_is_quieter(tmp_path, monkeypatch):
    path = tmp_path / "probe.json"
    calls = []
    busy = _quiet(load_average=3.0)  # 1.5 runnable tasks a CPU
    monkeypatch.setattr(probe, "measure", lambda *a: calls.append(a) or dict(busy))
    monkeypatch.setattr(probe, "load_now", lambda: 3.0)
    probe.probe_this_machine(cache_path=path, **SMALL)
    probe.probe_this_machine(cache_path=path, **SMALL)  # still as busy: measuring again gains nothing
    assert len(calls) == 1
    monkeypatch.setattr(probe, "load_now", lambda: 0.2)
    busy = _quiet(load_average=0.2)
    probe.probe_this_machine(cache_path=path, **SMALL)
    assert len(calls) == 2
    probe.probe_this_machine(cache_path=path, **SMALL)  # quiet now: cached
    assert len(calls) == 2
    (entry,) = json.loads(path.read_text()).values()
    assert "load average 0.20 on 2 CPUs" in probe.spec_from_measurement(entry).source


def test_a_probe_stored_without_its_load_is_taken_again(tmp_path, monkeypatch):
    path = tmp_path / "probe.json"
    key = probe.probe_key("cpu", __import__("torch").get_num_threads(), **SMALL)
    old = {k: v for k, v in SLOW_BF16.items() if k not in ("load_average", "cpus")}
    path.write_text(json.dumps({key: old}))  # as an older inferpath wrote it
    calls = []
    monkeypatch.setattr(probe, "measure", lambda *a: calls.append(a) or _quiet())
    monkeypatch.setattr(probe, "load_now", lambda: 0.1)
    probe.probe_this_machine(cache_path=path, **SMALL)
    probe.probe_this_machine(cache_path=path, **SMALL)
    assert len(calls) == 1


def test_the_real_measurement_records_its_load(tmp_path):
    measured = probe.measure("cpu", **SMALL)
    assert measured["load_average"] >= 0 and measured["cpus"] >= 1 and measured["measured_at"] > 0
