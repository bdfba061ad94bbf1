"""`inferpath explain --json`, `inferpath roofline`, and the this-machine probe."""

from __future__ import annotations

import json

import pytest

from inferpath.cli import main
from inferpath.explain import probe
from inferpath.explain.cost import STAGE_NAMES
from inferpath.explain.hardware import get_hardware


def test_explain_json_has_every_stage_and_consistent_totals(capsys):
    args = ["explain", "--model", "mixtral-8x7b", "--hardware", "a100", "--prompt-tokens", "64",
            "--output-tokens", "16", "--batch", "4", "--dtype", "int8", "--devices", "2",
            "--context", "500", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    prefill = [s["name"] for s in data["prefill"]["stages"]]
    assert prefill == [s for s in STAGE_NAMES]  # MoE: the router is there too
    assert data["decode_step"]["context_len"] == 500 and data["decode_step"]["batch"] == 4
    assert data["weights"]["total_params"] > 3 * data["weights"]["active_params"]
    assert data["totals"]["num_passes"] == 17
    assert data["totals"]["total_time_s"] == pytest.approx(
        data["totals"]["ttft_s"] + data["totals"]["decode_time_s"])
    assert data["seed"] is None  # not the seed's example
    for stage in data["prefill"]["stages"]:
        assert stage["bound"] in ("compute", "memory", "host")
        assert stage["time_s"] == max(stage["compute_time_s"], stage["memory_time_s"])


def test_explain_text_reads_in_plain_words(capsys):
    assert main(["explain", "--model", "smollm2-135m", "--hardware", "l4", "--prompt-tokens", "20",
                 "--output-tokens", "10"]) == 0
    out = capsys.readouterr().out
    assert "decode is memory-bound" in out
    assert "LM head tied to the embedding" in out
    assert "batch size" in out and "sharded over N devices" in out


def test_explain_reads_the_shapes_of_a_real_model_alias(capsys):
    assert main(["explain", "--model", "smollm2-135m-instruct", "--hardware", "rtx-4090",
                 "--output-tokens", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["name"] == "smollm2-135m-instruct"
    assert data["model"]["num_layers"] == 30 and data["model"]["tie_word_embeddings"]
    assert data["weights"]["total_params"] == 134_515_008  # the tensors in the GGUF file
    # --dtype auto: the file's own formats, as inferpath runs them (Q4_1 + a Q8_0 embedding)
    assert data["request"]["weight_format"].startswith("Q4_1 + Q8_0")
    assert abs(data["weights"]["total_bytes"] / 1e6 - 96.5) < 0.2


def test_explain_rejects_an_unknown_model(capsys):
    assert main(["explain", "--model", "gpt-9"]) == 1
    assert "unknown model 'gpt-9'" in capsys.readouterr().err


def test_roofline_writes_a_png(tmp_path, capsys):
    out = tmp_path / "roofline.png"
    assert main(["roofline", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_roofline_json_places_prefill_and_decode_on_both_sides_of_the_ridge(capsys):
    assert main(["roofline", "--model", "llama-3-70b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    passes = {p["pass"]: p for p in data["points"] if p["stage"] == "pass"}
    assert passes["decode batch 1"]["bound"] == "memory"
    assert passes["prefill 2000 tokens"]["bound"] == "compute"
    for p in data["points"]:  # every stage sits on or under the roof
        roof = min(data["peak_flops"], data["memory_bandwidth"] * p["intensity"])
        assert p["flops_per_s"] <= roof * (1 + 1e-9)


def test_probe_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "probe.json"
    first = probe.probe_this_machine(bandwidth_bytes=4 * 2**20, matmul_n=64, cache_path=path)
    assert first.memory_bandwidth > 0 and first.flops_for("fp32") > 0 and first.flops_for("bf16") > 0
    assert json.loads(path.read_text())

    def fail(*args):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(probe, "measure", fail)
    again = probe.probe_this_machine(bandwidth_bytes=4 * 2**20, matmul_n=64, cache_path=path)
    assert again == first


def test_this_machine_is_a_hardware_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERPATH_CACHE", str(tmp_path))
    monkeypatch.setattr(probe, "DEFAULT_BANDWIDTH_BYTES", 4 * 2**20)
    monkeypatch.setattr(probe, "DEFAULT_MATMUL_N", 64)
    spec = get_hardware("this-machine")
    assert spec.name == "this-machine" and "measured on cpu" in spec.source
    assert (tmp_path / "probe.json").exists()
