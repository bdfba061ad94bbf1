"""Reasoning through the official clients against real servers on 127.0.0.1.

The model is a tiny Qwen3 whose weights make greedy decoding write a fixed answer
(tests/reasoning_model.py): ``<think>Hmm ok</think>Hi there`` after Qwen3's generation
prompt, ``Hello`` after the prompt of ``enable_thinking: false``, ``Hmm ok</think>Hi
there`` when the prompt opened the think block itself, and (under gpt-oss's template)
``<|channel|>analysis<|message|>Sure,<|end|>``. Each answer must come back with the
reasoning in its own fields and the content clean, streamed and not, on chat completions,
the Responses API and Anthropic's Messages API.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread
from reasoning_model import OPEN_THINK, build_thinking_models
from server_harness import client

REASONING, CONTENT = "Hmm ok", "Hi there"
USER = [{"role": "user", "content": "hi"}]


def _serve(directory) -> ServerThread:
    engine = LLMEngine.from_model(str(directory), EngineConfig(max_model_len=4096))
    return ServerThread(build_app(AsyncEngine(engine), served_model_name="tiny")).start(timeout=120)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_thinking_models(tmp_path_factory.mktemp("thinking"))


@pytest.fixture(scope="module")
def qwen(models):
    server = _serve(models["qwen3"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(qwen):
    return client(qwen)


def _chat(oai, stream=False, **extra):
    return oai.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=20,
                                       stream=stream, extra_body=extra or None)


def _streamed(chunks) -> dict:
    """Concatenated reasoning_content, reasoning and content deltas of a chat stream."""
    got = {"reasoning_content": "", "reasoning": "", "content": "", "finish_reason": None}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            pieces = {key for key in ("reasoning_content", "reasoning") if delta.get(key)}
            assert not (pieces and delta.get("content")), delta  # never mixed in one delta
            for key in ("reasoning_content", "reasoning", "content"):
                got[key] += delta.get(key) or ""
            got["finish_reason"] = choice.finish_reason or got["finish_reason"]
    return got


def test_chat_reasoning_apart_from_content(oai):
    message = _chat(oai).choices[0].message
    assert message.content == CONTENT
    assert message.reasoning_content == REASONING and message.reasoning == REASONING


def test_chat_stream_reasoning_deltas(oai):
    got = _streamed(_chat(oai, stream=True))
    assert got == {"reasoning_content": REASONING, "reasoning": REASONING, "content": CONTENT,
                   "finish_reason": "stop"}


def test_include_reasoning_false_drops_it(oai):
    message = _chat(oai, include_reasoning=False).choices[0].message
    assert (message.content, message.reasoning_content, message.reasoning) == (CONTENT, None, None)
    got = _streamed(_chat(oai, stream=True, include_reasoning=False))
    assert (got["content"], got["reasoning_content"], got["reasoning"]) == (CONTENT, "", "")


def test_chat_template_kwargs_enable_thinking_false(oai):
    message = _chat(oai, chat_template_kwargs={"enable_thinking": False}).choices[0].message
    assert (message.content, message.reasoning_content) == ("Hello", None)


def test_prompt_that_opens_the_think_block(oai):
    # the model writes "Hmm ok</think>Hi there": no <think>, the prompt holds it
    message = _chat(oai, chat_template_kwargs={OPEN_THINK: True}).choices[0].message
    assert (message.reasoning_content, message.content) == (REASONING, CONTENT)
    got = _streamed(_chat(oai, stream=True, chat_template_kwargs={OPEN_THINK: True}))
    assert (got["reasoning"], got["content"]) == (REASONING, CONTENT)


def test_reasoning_fields_the_template_cannot_take_are_refused(oai):
    with pytest.raises(openai.BadRequestError) as error:
        _chat(oai, reasoning_effort="high")
    assert error.value.body["param"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as error:
        _chat(oai, chat_template_kwargs={"no_such_variable": 1})
    assert error.value.body["param"] == "chat_template_kwargs"


def test_responses_reasoning_item(oai):
    response = oai.responses.create(model="tiny", input="hi", temperature=0, max_output_tokens=20)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", REASONING)]
    assert message.type == "message" and response.output_text == CONTENT
    assert response.usage.output_tokens_details.reasoning_tokens == 2  # "Hmm", " ok"


def test_responses_stream_reasoning_events(oai):
    deltas, done = [], []
    with oai.responses.stream(model="tiny", input="hi", temperature=0, max_output_tokens=20) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.reasoning_text.done":
                done.append(event.text)
        final = stream.get_final_response()
    assert "".join(deltas) == REASONING and done == [REASONING]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == REASONING and final.output_text == CONTENT


def test_responses_reasoning_input_item_reaches_the_template(qwen, oai):
    # Qwen3's template shows the reasoning of assistant turns after the last user query
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    item = {"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": "I should call f."}]}
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    plain = oai.responses.create(model="tiny", input=[USER[0] | {"type": "message"}, call, output],
                                 tools=tools, max_output_tokens=1)
    reasoned = oai.responses.create(model="tiny", input=[USER[0] | {"type": "message"}, item, call,
                                                          output], tools=tools, max_output_tokens=1)
    assert reasoned.usage.input_tokens > plain.usage.input_tokens


@pytest.fixture(scope="module")
def claude(qwen):
    return anthropic.Anthropic(base_url=qwen.url, api_key="unused", max_retries=0, timeout=120)


def test_messages_thinking_blocks(claude):
    message = claude.messages.create(model="tiny", max_tokens=20, messages=USER)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] \
        == [("thinking", REASONING), ("text", CONTENT)]
    with claude.messages.stream(model="tiny", max_tokens=20, messages=USER) as stream:
        thinking = "".join(e.delta.thinking for e in stream
                           if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
        final = stream.get_final_message()
    assert thinking == REASONING
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == CONTENT


def test_messages_thinking_disabled(claude):
    message = claude.messages.create(model="tiny", max_tokens=20, messages=USER,
                                     thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello")]


def test_messages_thinking_input_blocks_reach_the_template(claude):
    tool = {"name": "f", "input_schema": {"type": "object", "properties": {}}}

    def count(assistant_blocks):
        history = USER + [{"role": "assistant", "content": assistant_blocks},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                        "content": "ok"}]}]
        return claude.messages.count_tokens(model="tiny", messages=history, tools=[tool]).input_tokens

    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    thinking = {"type": "thinking", "thinking": "I should call f.", "signature": ""}
    assert count([thinking, use]) > count([use])


@pytest.fixture(scope="module")
def gpt_oss(models):
    server = _serve(models["gpt_oss"])
    yield server
    server.stop()


def test_harmony_analysis_channel_is_reasoning(gpt_oss):
    oai = client(gpt_oss)
    message = _chat(oai, reasoning_effort="high").choices[0].message
    assert (message.reasoning_content, message.content) == ("Sure,", "")
    got = _streamed(_chat(oai, stream=True, reasoning_effort="low"))
    assert (got["reasoning"], got["content"], got["finish_reason"]) == ("Sure,", "", "stop")
    response = oai.responses.create(model="tiny", input="hi", temperature=0, max_output_tokens=20,
                                    reasoning={"effort": "high"})
    assert response.reasoning.effort == "high" and not response.warnings
    assert response.output[0].content[0].text == "Sure,"


@pytest.fixture(scope="module")
def gpt_oss_call(models):
    server = _serve(models["gpt_oss_call"])
    yield server
    server.stop()


def test_harmony_tool_call(gpt_oss_call):
    """``<|channel|>commentary to=functions.get_weather ...<|message|>{...}<|call|>``: a
    tool call (ended by gpt-oss's <|call|> stop token), streamed and not, and a Responses
    function_call item."""
    oai = client(gpt_oss_call)
    function = {"name": "get_weather", "description": "Weather.",  # gpt-oss's template needs one
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    tools = [{"type": "function", "function": function}]
    choice = oai.chat.completions.create(model="tiny", messages=USER, max_tokens=40,
                                         tools=tools).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] \
        == [("get_weather", '{"city": "Paris"}')]
    names, arguments, finish = "", "", None
    for chunk in oai.chat.completions.create(model="tiny", messages=USER, max_tokens=40,
                                             tools=tools, stream=True):
        for call in chunk.choices[0].delta.tool_calls or ():
            names += call.function.name or ""
            arguments += call.function.arguments or ""
        assert not chunk.choices[0].delta.content
        finish = chunk.choices[0].finish_reason or finish
    assert (names, arguments, finish) == ("get_weather", '{"city": "Paris"}', "tool_calls")
    response = oai.responses.create(model="tiny", input="hi", max_output_tokens=40,
                                    tools=[{"type": "function", **tools[0]["function"]}])
    assert [(i.type, i.name, i.arguments) for i in response.output] \
        == [("function_call", "get_weather", '{"city": "Paris"}')]
    # without tools the call is not parsed: its text is the answer
    plain = oai.chat.completions.create(model="tiny", messages=USER, max_tokens=40).choices[0]
    assert plain.message.content == '{"city": "Paris"}' and plain.finish_reason == "stop"
