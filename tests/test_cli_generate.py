"""``inferpath generate`` end to end on the default model (SmolLM2-135M-Instruct)."""

import re

from inferpath.cli import main


def test_generate_streams_text_and_ends_with_a_summary_line(capsys):
    code = main(["generate", "What is a quadratic equation?", "--max-tokens", "16"])
    captured = capsys.readouterr()
    assert code == 0
    assert len(captured.out.split()) >= 5  # 16 tokens of English
    assert "<|im_end|>" not in captured.out and "<|im_start|>" not in captured.out
    summary = captured.err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"\[prompt (\d+) tokens \| TTFT \d+ ms \| decode [\d.]+ tok/s \((\d+) tokens\) \| "
        r"((?:Q4_1 \+ Q8_0 as laid out|Q4_1 \+ Q8_0 repacked by 8 rows), float32 activations and KV, "
        r"kernels (?:avx512|avxvnni|avx2|generic), \d+ threads"
        r"(?: \(one-sequence decode: (?:trying \d+ and 1|\d+, measured faster)\))?, native decode) \| "
        r"([\d.]+) MB/token, (?:\d+% of the [\d.]+ GB/s floor|read [\d.]+ GB/s: above the probed [\d.]+ "
        r"GB/s floor \(probe stale: measured again next run\)) \| "
        r"KV [\d.]+ MB \((\d+) tokens x ([\d,]+) B\) \| finish (\w+)\]", summary)
    assert match, summary
    num_prompt, num_out, num_tokens = (int(match.group(i)) for i in (1, 2, 5))
    assert num_out == 16 and num_tokens == num_prompt + num_out
    # the default dtype (auto) runs the packaged Q4_1 file quantized: the file's weight bytes
    assert abs(float(match.group(4)) - 96.6) < 0.2, summary
    # seed formula for SmolLM2: 2 x 30 layers x 3 kv heads x 64 head dim x 4 bytes (fp32)
    assert match.group(6) == f"{2 * 30 * 3 * 64 * 4:,}" and match.group(7) == "length"
    assert num_prompt > len("What is a quadratic equation?".split())  # chat template applied


def test_the_floor_is_never_quoted_above_100_percent():
    from inferpath.cli.generate import floor_text

    assert floor_text(10e9, 20e9) == ", 50% of the 20.0 GB/s floor"
    assert "above the probed 20.0 GB/s floor" in floor_text(30e9, 20e9)
    assert "%" not in floor_text(30e9, 20e9)


def test_bad_sampling_flag_is_an_error_naming_the_parameter(capsys):
    code = main(["generate", "hi", "--temperature", "-1"])
    assert code == 1
    assert "temperature" in capsys.readouterr().err


def test_generate_with_speculative_config_shows_the_acceptance_length(capsys):
    code = main(["generate", "Repeat exactly: one two three, one two three, one two three.",
                 "--max-tokens", "16", "--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 3}'])
    captured = capsys.readouterr()
    assert code == 0
    summary = captured.err.strip().splitlines()[-1]
    match = re.search(r"\| speculative: acceptance length ([\d.]+) over (\d+) verifications \| KV", summary)
    assert match, summary
    assert 1.0 <= float(match.group(1)) <= 4.0 and int(match.group(2)) > 0
    assert "floor" not in summary  # tokens/s x bytes per token is no read rate with drafts
