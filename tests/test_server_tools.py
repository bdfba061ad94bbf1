"""Tool calling through the official openai client against a real server over
Qwen2.5-Coder-0.5B-Instruct (its chat template renders ``tools`` in the hermes syntax):

- ``tool_choice="required"`` and a named function always give a well-formed call whose
  arguments are valid against the function's schema, streamed and not (the streamed
  fragments concatenate to the same call);
- ``auto`` gives text or a call; ``parallel_tool_calls=False`` gives one call;
- the follow-up turn (assistant tool_calls + a ``tool`` message) renders and answers.

Greedy, short answers: the 0.5B model costs ~0.1 s a token here.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string"},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
       "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
QUESTION = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    engine = LLMEngine.from_model("qwen2.5-coder-0.5b-instruct", EngineConfig(max_model_len=2048))
    server = ServerThread(build_app(AsyncEngine(engine), served_model_name=MODEL)).start(timeout=120)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    server.stop()


def _check_calls(calls, names) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed_calls(stream) -> tuple[list[dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] = delta.function.name or call["name"]
                    call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice, names", [
    ("required", {"get_weather", "add"}),
    ({"type": "function", "function": {"name": "add"}}, {"add"}),
], ids=["required", "named"])
def test_forced_tool_calls_are_well_formed_streamed_and_not(client, tool_choice, names):
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                         tool_choice=tool_choice, temperature=0, max_tokens=64)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls, names)

    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                            tool_choice=tool_choice, temperature=0, max_tokens=64,
                                            stream=True)
    streamed, finish = _streamed_calls(stream)
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]


def test_auto_gives_text_or_a_call_and_parallel_false_gives_one(client):
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                         tool_choice="auto", temperature=0, max_tokens=48)
    message = out.choices[0].message
    if message.tool_calls:
        _check_calls(message.tool_calls, set(SCHEMAS))
    else:
        assert message.content
    one = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}],
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64)
    assert len(one.choices[0].message.tool_calls) == 1


def test_follow_up_turn_with_the_tool_result(client):
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                           tool_choice={"type": "function",
                                                        "function": {"name": "get_weather"}},
                                           temperature=0, max_tokens=48)
    call = first.choices[0].message.tool_calls[0]
    history = QUESTION + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"city": "Paris", "temperature_celsius": 18})},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                            temperature=0, max_tokens=32)
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and result rendered


def test_unknown_named_function_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert caught.value.body["param"] == "tool_choice"


def test_langchain_bind_tools_and_with_structured_output(client):
    """LangChain's ChatOpenAI (langchain-openai, a test extra) round-trips both."""
    import pydantic
    from langchain_openai import ChatOpenAI

    class Weather(pydantic.BaseModel):
        """The weather asked about."""

        city: str
        unit: str

    chat = ChatOpenAI(model=MODEL, base_url=str(client.base_url), api_key="unused",
                      temperature=0, max_tokens=48, max_retries=0)
    with_tools = chat.bind_tools([TOOLS[0]], tool_choice="required")
    message = with_tools.invoke("What's the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    jsonschema.validate(message.tool_calls[0]["args"], WEATHER)
    weather = chat.with_structured_output(Weather).invoke("Paris, in celsius: what weather?")
    assert isinstance(weather, Weather)
