"""The seed's Llama-3-70B example, figure by figure (issue 5's acceptance table).

Llama-3-70B, H100 SXM, bf16, "What is a quadratic equation?" = 7 tokens, a 184-token
answer. Each test states the seed's figure literally. Where the seed's arithmetic is loose
the test checks both the exact value and what the seed's figure counts instead.
"""

from __future__ import annotations

import dataclasses

import pytest

from inferpath.cli import main
from inferpath.explain.cost import Precision
from inferpath.explain.hardware import get_hardware
from inferpath.explain.params import weight_breakdown
from inferpath.explain.request import estimate_request
from inferpath.explain.seed import seed_figures, seed_spec

GB, TB, MB = 1e9, 1e12, 1e6


@pytest.fixture(scope="module")
def seed():
    return estimate_request(seed_spec())


@pytest.fixture(scope="module")
def figures(seed):
    return {f.name: f for f in seed_figures(seed)}


def test_embedding_table_and_lm_head_are_2_1_gb(seed):
    assert round(seed.weights.embedding_bytes / GB, 1) == 2.1
    assert round(seed.weights.head_bytes / GB, 1) == 2.1
    assert seed.weights.embedding_params == 128_256 * 8_192


def test_one_layer_is_1_7113_gb_and_the_seeds_1_712_is_137_gb_over_80(seed, figures):
    w = seed.weights
    assert w.per_layer_params == 855_654_400
    assert round(w.per_layer_bytes / GB, 4) == 1.7113  # exact: rounds to 1.711, not 1.712
    assert round(round(w.layers_bytes / GB) / 80, 4) == 1.7125  # the seed's reading
    assert not figures["one layer"].matches and figures["one layer"].reading_matches
    assert "137 GB / 80" in figures["one layer"].counts


def test_all_weights_are_about_140_gb(seed):
    assert seed.weights.total_params == 70_553_706_496
    assert round(seed.weights.total_bytes / GB, -1) == 140  # 141.1 GB


def test_ffn_holds_82_percent_of_a_layer(seed):
    assert round(seed.weights.ffn_share * 100) == 82
    assert round(seed.weights.attention_share * 100) == 18


def test_kv_is_327680_bytes_per_token_and_0_33_mb(seed):
    assert seed.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert round(seed.kv_bytes_per_token / MB, 2) == 0.33


def test_kv_of_the_prompt_is_2_3_mb(seed):
    assert seed.prompt_kv_bytes == 7 * 327_680
    assert round(seed.prompt_kv_bytes / MB, 1) == 2.3


def test_kv_of_8000_tokens_is_2_6_gb(seed):
    assert round(seed.kv_bytes_per_token * 8000 / GB, 1) == 2.6


def test_64_kv_heads_the_seeds_2_5_mb_and_20_gb_are_binary_units(figures):
    config = dataclasses.replace(seed_spec().config, num_kv_heads=64)
    per_token = config.kv_bytes_per_token(2)
    assert per_token == 2_621_440
    assert per_token / 2**20 == 2.5  # "2.5 MB" is MiB; decimal it is 2.62 MB
    assert round(per_token / MB, 2) == 2.62
    total = per_token * 8000
    assert round(total / GB, 2) == 20.97  # decimal: 21 GB
    assert round(total / 2**30) == 20  # "20 GB" is 19.5 GiB
    for name in ("KV per token with 64 KV heads", "KV of 8,000 tokens with 64 KV heads"):
        assert not figures[name].matches and figures[name].reading_matches
        assert "GiB" in figures[name].counts or "MiB" in figures[name].counts


def test_ridge_is_about_295_flop_per_byte():
    assert round(get_hardware("h100-sxm").ridge_point("bf16")) == 295


def test_a_decode_step_reads_139_gb_the_seeds_137_gb_is_the_layers(seed, figures):
    step = seed.decode.first
    assert round(step.weight_bytes / GB, 1) == 139.0  # layers + LM head + one embedding row
    assert round(seed.weights.layers_bytes / GB) == 137
    assert step.weight_bytes == pytest.approx(
        seed.weights.layers_bytes + seed.weights.head_bytes + 8192 * 2 + 8192 * 2)  # + norm
    assert "LM head" in figures["weights read per decode step"].counts


def test_decode_is_about_41_ms_per_token_and_24_tokens_per_s(seed, figures):
    assert 0.041 < seed.decode_time_per_token_s < 0.042  # exact: 41.5 ms
    assert round(137 * GB / 3.35e12 * 1e3) == 41  # the seed's arithmetic: layers only
    assert round(seed.tokens_per_s) == 24
    assert seed.decode.first.bound == "memory"
    assert figures["decode time per token"].reading_matches


def test_decode_on_h200_is_about_29_ms_and_35_tokens_per_s():
    h200 = estimate_request(seed_spec(hardware=get_hardware("h200")), with_tables=False)
    assert round(h200.decode_time_per_token_s * 1e3) == 29
    assert round(h200.tokens_per_s) in (34, 35)  # 34.5: "near 35"


def test_int8_halves_the_decode_floor(seed):
    int8 = estimate_request(seed_spec(precision=Precision("int8")), with_tables=False)
    assert int8.decode_time_per_token_s / seed.decode_time_per_token_s == pytest.approx(0.5, abs=0.005)


def test_185_forward_passes(seed):
    assert seed.num_passes == 185  # 1 prefill + 184 decode; the last one samples the stop token
    no_stop = estimate_request(seed_spec(ends_with_stop=False), with_tables=False)
    assert no_stop.num_passes == 184


def test_weight_traffic_is_25_7_tb_and_the_seeds_25_2_is_184_times_137_gb(seed, figures):
    per_pass = seed.decode.first.weight_bytes
    assert seed.total_weight_traffic == pytest.approx(185 * per_pass, rel=1e-6)
    assert round(seed.total_weight_traffic / TB, 1) == 25.7
    assert round(184 * 137 * GB / TB, 1) == 25.2
    figure = figures["total weight traffic"]
    assert not figure.matches and figure.reading_matches and "184 decode passes" in figure.counts


def test_final_kv_is_63_mb_for_191_tokens(seed):
    assert seed.spec.final_kv_tokens == 191
    assert seed.final_kv_bytes == 191 * 327_680
    assert round(seed.final_kv_bytes / MB) == 63


def test_prefill_is_roughly_40_ms_and_half_a_percent_of_the_wall_time(seed):
    assert round(seed.ttft_s * 1e3, -1) == 40  # 41.6 ms
    assert seed.prefill.bound == "memory"
    assert round(seed.prefill_share * 100, 1) == 0.5


def test_decode_takes_7_64_s_and_the_seeds_7_7_s_is_all_185_passes(seed, figures):
    assert round(seed.decode.time_s, 2) == 7.64
    assert round(seed.total_time_s, 1) == 7.7
    assert figures["decode time, whole answer"].reading_matches


def test_prefill_intensity_14_is_flops_per_parameter(seed, figures):
    assert seed.prefill.layer_matmul_flops_per_param == 14  # 2 x 7
    assert seed.prefill.layer_matmul_intensity == pytest.approx(7, rel=0.01)  # per bf16 byte
    assert "per weight *parameter*" in figures["prefill intensity, 7 tokens"].counts


def test_prefill_of_2000_tokens_reaches_about_4000_and_is_compute_bound(seed):
    spec = seed_spec(prompt_tokens=2000)
    p = spec.pass_at(2000, 2000)
    assert p.layer_matmul_flops_per_param == 4000
    assert p.layer_matmul_intensity > get_hardware("h100-sxm").ridge_point()
    assert p.bound == "compute"


def test_decode_intensity_is_about_2_flops_per_parameter(seed):
    step = seed.decode.first
    assert step.layer_matmul_flops_per_param == 2
    assert step.layer_matmul_intensity == pytest.approx(1, rel=0.01)


def test_prompt_activations_229_kb_are_fp32_values(seed, figures):
    assert seed.prompt_activation_bytes == 7 * 8192 * 2  # bf16: 114.7 KB
    assert round(7 * 8192 * 4 / 1e3) == 229
    assert "fp32" in figures["prompt activations"].counts


def test_over_99_99_percent_of_decode_bytes_are_the_model(seed):
    step = seed.decode.first
    kv_read = step.context_len * seed.kv_bytes_per_token
    assert step.weight_bytes / (step.weight_bytes + kv_read) > 0.9999


def test_int8_fits_one_h100_and_bf16_needs_two(seed):
    assert weight_breakdown(seed.spec.config, 1).total_bytes < 80 * GB < seed.weights.total_bytes
    fits = {row["devices"]: row["fits"] for row in seed.device_table}
    assert fits == {1: False, 2: True, 4: True, 8: True}


def test_every_seed_figure_matches_or_says_what_it_counts(figures):
    for f in figures.values():
        assert f.reading_matches, f.name
        if not f.matches:
            assert f.counts, f"{f.name}: a loose figure must say what it counts"


def test_explain_output_shows_the_seed_comparison(capsys):
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    assert "decode is memory-bound: 139.0 GB of weights read per token" in out
    assert "41.5 ms at 3.35 TB/s" in out
    assert "137 GB is the 80 layers" in out
    assert "185 forward passes" in out
