"""The reasoning parsers (server/reasoning.py, reasoning_harmony.py) and the tool-call
syntaxes on split-token streams: any split of a text into deltas gives the same
reasoning, content and calls as the whole text at once, and no tag leaks into either."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.server.reasoning import (
    choose_reasoning_parser,
    join_pieces,
    new_reasoning_parser,
    prompt_opens_think,
    split_reasoning,
)

THINK_CASES = [
    # (text, starts_inside, reasoning, content)
    ("<think>\nLet me see.\n</think>\n\nThe answer is 4.", False, "Let me see.", "The answer is 4."),
    ("<think></think>Hi", False, "", "Hi"),
    ("Just an answer.", False, None, "Just an answer."),
    ("  <b>not a think</b>", False, None, "  <b>not a think</b>"),
    ("<think>still thinking when cut", False, "still thinking when cut", ""),
    ("opened in the prompt</think>\n\nanswer", True, "opened in the prompt", "answer"),
    ("<think>\nr1 writes it anyway\n</think>x", True, "r1 writes it anyway", "x"),
    ("no end tag at all", True, "no end tag at all", ""),
    ("<think>a < b </thin k> c</think>content with </think> inside", False,
     "a < b </thin k> c", "content with </think> inside"),
    ("", False, None, ""),
]

HARMONY_CALL = ('<|channel|>analysis<|message|>Need the weather.<|end|>'
                '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
                '<|message|>{"city": "Paris"}<|call|>')
HARMONY_CASES = [
    # (text, reasoning, content, calls as (name, arguments))
    ("<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Hello!<|return|>", "User says hi.", "Hello!", []),
    ("<|channel|>analysis<|message|>thinking only", "thinking only", "", []),
    (HARMONY_CALL, "Need the weather.", "", [("get_weather", '{"city": "Paris"}')]),
    ("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": [1, 2]}",
     None, "", [("f", '{"a": [1, 2]}')]),
    ("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.f<|message|>not json<|call|>", None, "Let me check.not json", []),
    ("plain text, no channels", None, "plain text, no channels", []),
    ("<|channel|>final<|message|>a <|x|> b", None, "a <|x|> b", []),
]


def _split_run(name: str, text: str, cuts: list[int], starts_inside: bool = False):
    parser = new_reasoning_parser(name, starts_inside)
    pieces, last = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        pieces += parser.add(text[last:cut])
        last = cut
    pieces += parser.finish()
    return pieces


def _calls(calls):
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("text, starts_inside, reasoning, content", THINK_CASES)
def test_think_parser_whole(text, starts_inside, reasoning, content):
    got = split_reasoning(new_reasoning_parser("qwen3", starts_inside), text)
    assert got[:2] == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content, calls", HARMONY_CASES)
def test_harmony_parser_whole(text, reasoning, content, calls):
    got_reasoning, got_content, got_calls = split_reasoning(new_reasoning_parser("gpt_oss"), text)
    assert (got_reasoning, got_content, _calls(got_calls)) == (reasoning, content, calls)


@settings(max_examples=100, deadline=None)
@given(case=st.sampled_from(THINK_CASES), data=st.data())
def test_think_parser_any_split(case, data):
    text, starts_inside, reasoning, content = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    pieces = _split_run("qwen3", text, cuts, starts_inside)
    # pieces once sent are final, so equal joins mean no tag (or part of one) leaked
    assert join_pieces(pieces)[:2] == (reasoning, content)


@settings(max_examples=100, deadline=None)
@given(case=st.sampled_from(HARMONY_CASES), data=st.data())
def test_harmony_parser_any_split(case, data):
    text, reasoning, content, calls = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=16))
    got_reasoning, got_content, got_calls = join_pieces(_split_run("gpt_oss", text, cuts))
    assert (got_reasoning, got_content, _calls(got_calls)) == (reasoning, content, calls)
    assert "<|" not in (got_reasoning or "").replace("<|x|>", "")


def test_prompt_opens_think():
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_think("<|im_start|>assistant\n")


def test_parser_choice():
    assert choose_reasoning_parser("qwen3", "...<think>...") == "qwen3"
    assert choose_reasoning_parser("llama", "{{ messages }}") == "none"
    assert choose_reasoning_parser("gpt_oss", None) == "gpt_oss"
    assert choose_reasoning_parser("llama", "<|channel|>final") == "gpt_oss"
    assert choose_reasoning_parser("deepseek_v3", "<think>\n") == "deepseek_r1"
    assert choose_reasoning_parser("llama", "", "qwen3") == "qwen3"
    with pytest.raises(ValueError, match="deepseek_r1"):
        choose_reasoning_parser("llama", "", "r1")
    assert json.dumps(THINK_CASES)  # the cases are plain data


TOOL_CASES = [
    # (fmt, text, content, calls)
    ("hermes", 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', "Sure.",
     [("f", '{"x": 1}')]),
    ("hermes", '<tool_call>\n{"name": "f", "argu', '<tool_call>\n{"name": "f", "argu', []),
    ("llama4", '[get_weather(city="Paris", days=2), now()]', "",
     [("get_weather", '{"city": "Paris", "days": 2}'), ("now", "{}")]),
    ("llama4", '<|python_start|>[f(a=[1, {"b": None}])]<|python_end|>', "",
     [("f", '{"a": [1, {"b": null}]}')]),
    ("llama4", '{"name": "f", "parameters": {"q": "x"}}', "", [("f", '{"q": "x"}')]),
    ("llama4", "[f(__import__('os'))]", "[f(__import__('os'))]", []),  # not literals: text
    ("llama4", "[1, 2] is a list", "[1, 2] is a list", []),
    ("llama4", "Plain answer.", "Plain answer.", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", TOOL_CASES)
def test_tool_syntax_whole(fmt, text, content, calls):
    from inferpath.server.tools import parse_tool_calls

    got_content, got_calls = parse_tool_calls(text, fmt)
    assert (got_content if got_calls else text, _calls(got_calls)) == (content, calls)


@settings(max_examples=100, deadline=None)
@given(case=st.sampled_from(TOOL_CASES), data=st.data())
def test_tool_stream_any_split(case, data):
    from inferpath.server.tool_stream import ToolCallStream

    fmt, text, content, calls = case
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))) + [len(text)]
    stream, deltas, last = ToolCallStream(fmt), [], 0
    for cut in cuts:
        deltas += stream.add(text[last:cut])
        last = cut
    tail, has_calls = stream.finish()
    deltas += tail
    assert "".join(d.get("content", "") for d in deltas) == content
    assert has_calls == bool(calls)
    streamed: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", ()):
            entry = streamed.setdefault(call["index"], ["", ""])
            entry[0] += call.get("function", {}).get("name", "")
            entry[1] += call.get("function", {}).get("arguments", "")
    assert [tuple(streamed[i]) for i in sorted(streamed)] == calls


def test_harmony_stop_tokens_a_gguf_lacks_are_added(tmp_path):
    from inferpath.server.reasoning import format_stop_token_ids
    from inferpath.tokenizer import load_tokenizer
    from reasoning_model import _tokenizer_json

    _tokenizer_json(tmp_path / "tokenizer.json")
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    ret, call = (tokenizer.encode(t, allow_special=True, add_bos=False)[0]
                 for t in ("<|return|>", "<|call|>"))
    assert format_stop_token_ids("gpt_oss", tokenizer, frozenset({ret})) == (call,)
    assert format_stop_token_ids("gpt_oss", tokenizer, frozenset({ret, call})) == ()
    assert format_stop_token_ids("qwen3", tokenizer, frozenset()) == ()


ANSWER_CASES = [
    # (reasoning parser, tool syntax, text, (reasoning, content, calls))
    ("qwen3", "hermes", '<think>\nI need f.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": '
     '{"x": 1}}\n</tool_call>', ("I need f.", "", [("f", '{"x": 1}')])),
    ("qwen3", "hermes", "<think>no call</think>Answer <tool_call> not json </tool_call>",
     ("no call", "Answer <tool_call> not json </tool_call>", [])),
    ("gpt_oss", "harmony", HARMONY_CALL, ("Need the weather.", "", [("get_weather", '{"city": "Paris"}')])),
    ("none", "llama4", '[f(a=1)]', (None, "", [("f", '{"a": 1}')])),
]


@settings(max_examples=100, deadline=None)
@given(case=st.sampled_from(ANSWER_CASES), data=st.data())
def test_answer_stream_agrees_with_the_whole_answer(case, data):
    """Reasoning, then tool calls in the content: streamed on any split as read whole."""
    from inferpath.server.answer import AnswerFormat, AnswerStream, read_answer

    parser, syntax, text, (reasoning, content, calls) = case
    fmt = AnswerFormat(parser, tool_format=syntax, parses_tool_calls=True)
    whole = read_answer(fmt, text)
    assert (whole.reasoning, whole.content, _calls(whole.calls)) == (reasoning, content, calls)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))) + [len(text)]
    stream, deltas, last = AnswerStream(fmt), [], 0
    for cut in cuts:
        deltas += stream.add(text[last:cut])
        last = cut
    tail, has_calls = stream.finish()
    deltas += tail
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (reasoning or "")
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("content", "") for d in deltas) == content
    streamed: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", ()):
            entry = streamed.setdefault(call["index"], ["", ""])
            entry[0] += call.get("function", {}).get("name", "")
            entry[1] += call.get("function", {}).get("arguments", "")
    assert [tuple(streamed[i]) for i in sorted(streamed)] == calls and has_calls == bool(calls)
