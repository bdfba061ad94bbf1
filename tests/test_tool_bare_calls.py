"""Hermes answers that write a call as bare or fenced JSON (small Qwen2.5-Coder models do):
read as the call when the answer is exactly one object naming an offered tool, else text;
streamed, any split of the text into deltas gives the same result as the whole text."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.server.tool_stream import ToolCallStream
from inferpath.server.tools import parse_tool_calls

TOOLS = ("exec_command", "apply_patch")
CALL = {"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt", "tty": False}}
FENCED = "```json\n" + json.dumps(CALL, indent=2) + "\n```"

ANSWERS = {  # answer -> the call's name, or None (text)
    FENCED: "exec_command",
    "  " + json.dumps(CALL) + "\n": "exec_command",
    "```\n" + json.dumps(CALL) + "\n```": "exec_command",
    "<tool_call>\n" + json.dumps(CALL) + "\n</tool_call>": "exec_command",
    FENCED.replace("exec_command", "rm_everything"): None,  # not an offered tool
    "Run this:\n" + FENCED: None,  # text around it: an explanation, not a call
    "```python\nprint('hi')\n```": None,
    json.dumps({"name": "exec_command", "arguments": "echo hi"}): None,  # arguments not an object
    json.dumps({"name": "exec_command", "arguments": "[1]"}): None,  # JSON text, not of an object
    # the arguments as JSON text, OpenAI's spelling (Qwen2.5-Coder-0.5B wrote Codex's calls so)
    "```json\n" + json.dumps({**CALL, "arguments": json.dumps(CALL["arguments"])}) + "\n```": "exec_command",
    "<tool_call>\n" + json.dumps({**CALL, "arguments": json.dumps(CALL["arguments"])}) + "\n</tool_call>": "exec_command",
    '{"cmd": "echo hi"}': None,
    "Sure, here is the file.": None,
}


def _calls(content_and_calls):
    content, calls = content_and_calls
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_bare_and_fenced_calls_are_read_only_when_they_name_an_offered_tool():
    for answer, name in ANSWERS.items():
        content, calls = _calls(parse_tool_calls(answer, "hermes", TOOLS))
        if name is None:
            assert (content, calls) == (answer, []), answer
        else:
            assert content == "" and calls == [(name, CALL["arguments"])], answer


def test_without_offered_tools_a_fenced_object_stays_text():
    assert _calls(parse_tool_calls(FENCED, "hermes")) == (FENCED, [])
    assert _calls(parse_tool_calls(FENCED, "hermes", ())) == (FENCED, [])


def _streamed(text: str, cuts: list[int]) -> tuple[str, list]:
    stream = ToolCallStream("hermes", TOOLS)
    deltas, bounds = [], sorted({0, len(text), *cuts})
    for start, end in zip(bounds, bounds[1:]):
        deltas += stream.add(text[start:end])
    tail, _ = stream.finish()
    deltas += tail
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, list] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] += call.get("function", {}).get("name", "")
            entry[1] += call.get("function", {}).get("arguments", "")
    return content, [(name, json.loads(arguments)) for name, arguments in calls.values()]


@settings(max_examples=60, deadline=None)
@given(answer=st.sampled_from(sorted(ANSWERS)), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_any_split_streams_what_the_whole_answer_parses_to(answer, cuts):
    expected = _calls(parse_tool_calls(answer, "hermes", TOOLS))
    assert _streamed(answer, [c % (len(answer) + 1) for c in cuts]) == expected


def test_a_code_answer_streams_before_it_finishes():
    stream = ToolCallStream("hermes", TOOLS)
    assert stream.add("```") == []  # may still be a ```json call
    assert stream.add("python\n") == [{"content": "```python"}]  # (trailing whitespace waits)
