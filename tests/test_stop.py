"""Stopping rules: EOS / stop ids / lengths, and stop strings across streamed deltas."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.sampling import SamplingParams
from inferpath.sampling.stop import StopStringStream, check_stop, find_stop_string, num_chars_to_hold_back

EOS = frozenset({2, 7})


def test_stop_module_imports_no_torch():
    import subprocess

    code = "import sys, inferpath.sampling.stop; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize(
    "token,num_out,params,expected",
    [
        (2, 1, SamplingParams(), ("stop", None)),  # every EOS id stops
        (7, 3, SamplingParams(), ("stop", None)),
        (5, 3, SamplingParams(), None),
        (2, 1, SamplingParams(ignore_eos=True), None),
        (9, 2, SamplingParams(stop_token_ids=[9]), ("stop", 9)),
        (9, 2, SamplingParams(stop_token_ids=[9], ignore_eos=True), ("stop", 9)),
        (5, 16, SamplingParams(), ("length", None)),  # default max_tokens 16
        (5, 15, SamplingParams(), None),
        (2, 4, SamplingParams(max_tokens=4), ("stop", None)),  # EOS wins over length
        (2, 2, SamplingParams(min_tokens=3), None),  # too early for EOS
        (9, 2, SamplingParams(min_tokens=3, stop_token_ids=[9]), None),
        (2, 3, SamplingParams(min_tokens=3), ("stop", None)),
        (5, 10_000, SamplingParams(max_tokens=None), None),
    ],
)
def test_check_stop(token, num_out, params, expected):
    assert check_stop(token, num_out, params, EOS) == expected


def test_check_stop_at_the_context_limit():
    params = SamplingParams(max_tokens=None)
    assert check_stop(5, 3, params, EOS, num_prompt_tokens=7, max_model_len=10) == ("length", None)
    assert check_stop(5, 2, params, EOS, num_prompt_tokens=7, max_model_len=10) is None


def test_find_stop_string_cuts_before_or_after_the_stop_string():
    text = "Answer: 42\n\nQuestion"
    new = len("42\n\nQuestion")
    assert find_stop_string(text, ["\n\n"], new) == (10, "\n\n")
    assert text[:10] == "Answer: 42"
    assert find_stop_string(text, ["\n\n"], new, include_stop_str_in_output=True) == (12, "\n\n")
    assert find_stop_string(text, ["nothing"], new) is None
    assert find_stop_string(text, [], new) is None


def test_find_stop_string_searches_only_where_a_new_match_can_be():
    # "END" lies wholly in old text: checked before, so not reported again.
    assert find_stop_string("xxENDyy", ["END"], 2) is None
    # Ends in the first new char, starts in old text.
    assert find_stop_string("xxENDyy", ["END"], 3) == (2, "END")
    # Matches that complete first win, whatever the list order.
    assert find_stop_string("abcd", ["bcd", "abc"], 4) == (0, "abc")
    assert find_stop_string("abcd", ["cd", "abcd"], 4) == (0, "abcd")  # same end: earlier start


def test_hold_back_counts_a_possible_stop_prefix():
    assert num_chars_to_hold_back("Hello <|e", ["<|end|>"]) == 3
    assert num_chars_to_hold_back("Hello <|end|", ["<|end|>"]) == 6
    assert num_chars_to_hold_back("Hello", ["<|end|>"]) == 0
    assert num_chars_to_hold_back("ab", ["abc", "b!"]) == 2
    assert num_chars_to_hold_back("anything", []) == 0


def test_stop_string_split_across_two_deltas():
    stream = StopStringStream(["###"])
    assert stream.add("The answer is 4#") == "The answer is 4"  # "#" held back
    assert stream.add("## more") == ""
    assert stream.stopped == "###"
    assert stream.emitted == "The answer is 4"
    assert stream.add("ignored") == "" and stream.flush() == ""


def test_stream_releases_a_false_alarm_and_flushes_at_the_end():
    stream = StopStringStream(["</s>"])
    assert stream.add("a <") == "a "
    assert stream.add("/x") == "</x"  # not a stop string after all
    assert stream.add(" </") == " "
    assert stream.flush() == "</"  # the sequence ended for another reason
    assert stream.stopped is None


def test_stream_includes_the_stop_string_when_asked():
    stream = StopStringStream(["STOP"], include_stop_str_in_output=True)
    out = stream.add("go ST") + stream.add("OP now")
    assert out == "go STOP" and stream.stopped == "STOP"


def reference_cut(text: str, stops: list[str], include: bool) -> str:
    """Brute force: the output ends where the first stop string to complete ends."""
    best = None
    for s in stops:
        for start in range(len(text) - len(s) + 1):
            if text.startswith(s, start):
                key = (start + len(s), start)
                best = key if best is None or key < best else best
    if best is None:
        return text
    end, start = best
    return text[: end if include else start]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab#", max_size=30),
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8),
    include=st.booleans(),
)
def test_streaming_equals_cutting_the_whole_text(text, stops, cuts, include):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    stream = StopStringStream(stops, include)
    out = "".join(stream.add(d) for d in deltas) + stream.flush()
    assert out == reference_cut(text, stops, include)
