"""Tool calls through the Responses and Messages APIs, and the OpenAI Agents SDK, against a
real server over Qwen2.5-Coder-0.5B-Instruct (its template renders tools in the hermes
syntax). The reference for every follow-up turn is the chat route: the same conversation
as chat messages renders the same prompt (equal prompt token counts).

- Responses: ``tool_choice`` required / a named namespace function give schema-valid
  ``function_call`` items, streamed and not (``responses.stream()`` accumulates the same
  call); the ``function_call_output`` round trip by ``previous_response_id`` is the same
  prompt as the whole conversation as items, and as chat messages;
- Messages: ``tool_choice`` any / tool give a schema-valid ``tool_use`` block, streamed and
  not; the ``tool_result`` follow-up is the chat conversation's prompt; count_tokens agrees;
- Agents SDK: an Agent with a ``@function_tool``, run by ``Runner.run`` through
  ``OpenAIResponsesModel`` over this server, calls the tool with valid arguments and
  finishes with an answer after reading its result.

Greedy and short: the 0.5B model costs ~0.1 s a token here.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import jsonschema
import openai
import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
       "required": ["a", "b"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": WEATHER, "strict": True},
         {"type": "namespace", "name": "math", "description": "Arithmetic",
          "tools": [{"type": "function", "name": "add", "description": "Add two numbers",
                     "parameters": ADD}]}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": WEATHER, "strict": True}},
              {"type": "function", "function": {"name": "math.add", "description": "Add two numbers",
                                                "parameters": ADD}}]
QUESTION = "What's the weather in Paris?"


@pytest.fixture(scope="module")
def server():
    engine = LLMEngine.from_model("qwen2.5-coder-0.5b-instruct", EngineConfig(max_model_len=4096))
    running = ServerThread(build_app(AsyncEngine(engine), served_model_name=MODEL)).start(timeout=120)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def test_responses_forced_calls_streamed_and_not(oai):
    kwargs = dict(model=MODEL, input=QUESTION, tools=TOOLS, temperature=0, max_output_tokens=60,
                  tool_choice={"type": "function", "name": "get_weather"})
    plain = oai.responses.create(**kwargs)
    (call,) = [item for item in plain.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert streamed.name == call.name
    assert json.loads(streamed.arguments) == json.loads(call.arguments)  # spacing may differ
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == streamed.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))

    namespaced = oai.responses.create(model=MODEL, input="Add 2 and 3.", tools=TOOLS, temperature=0,
                                      max_output_tokens=60,
                                      tool_choice={"type": "function", "name": "add", "namespace": "math"})
    (add,) = [item for item in namespaced.output if item.type == "function_call"]
    assert (add.namespace, add.name) == ("math", "add")
    jsonschema.validate(json.loads(add.arguments), ADD)

    required = oai.responses.create(model=MODEL, input=QUESTION, tools=TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, temperature=0, max_output_tokens=60)
    (any_call,) = [item for item in required.output if item.type == "function_call"]
    jsonschema.validate(json.loads(any_call.arguments), {"get_weather": WEATHER, "add": ADD}[any_call.name])


def test_responses_tool_round_trip_is_the_chat_conversation(oai):
    first = oai.responses.create(model=MODEL, input=QUESTION, tools=TOOLS, temperature=0,
                                 max_output_tokens=60, tool_choice="required", parallel_tool_calls=False)
    (call,) = [item for item in first.output if item.type == "function_call"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
    follow = oai.responses.create(model=MODEL, previous_response_id=first.id, input=[result],
                                  tools=TOOLS, temperature=0, max_output_tokens=30)
    assert follow.status in ("completed", "incomplete") and follow.output
    whole = oai.responses.create(
        model=MODEL, store=False, tools=TOOLS, temperature=0, max_output_tokens=30,
        input=[{"role": "user", "content": QUESTION},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "namespace": call.namespace, "arguments": call.arguments}, result])
    flat_name = f"{call.namespace}.{call.name}" if call.namespace else call.name
    chat = oai.chat.completions.create(
        model=MODEL, tools=CHAT_TOOLS, temperature=0, max_tokens=30,
        messages=[{"role": "user", "content": QUESTION},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": call.call_id, "type": "function",
                       "function": {"name": flat_name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "22 C, sunny"}])
    assert follow.usage.input_tokens == whole.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.usage.input_tokens_details.cached_tokens > 0  # the first turn's prefix


def test_messages_tool_use_any_streamed_and_not_and_the_tool_result(claude, oai):
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
    question = [{"role": "user", "content": QUESTION}]
    message = claude.messages.create(model=MODEL, max_tokens=60, messages=question, tools=tools,
                                     tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    with claude.messages.stream(model=MODEL, max_tokens=60, messages=question, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body={"temperature": 0}) as stream:
        streamed = stream.get_final_message()
    (streamed_use,) = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed_use.input == use.input and streamed.stop_reason == "tool_use"

    conversation = [*question, {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": "22 C, sunny"}]}]
    follow = claude.messages.create(model=MODEL, max_tokens=30, messages=conversation, tools=tools,
                                    extra_body={"temperature": 0})
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    chat = oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=30,
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": WEATHER}}],
        messages=[*question,
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": use.id, "type": "function",
                       "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
                  {"role": "tool", "tool_call_id": use.id, "content": "22 C, sunny"}])
    total = follow.usage.input_tokens + follow.usage.cache_read_input_tokens
    assert total == chat.usage.prompt_tokens
    counted = claude.messages.count_tokens(model=MODEL, messages=conversation, tools=tools)
    assert counted.input_tokens == total


def test_agents_sdk_runs_a_function_tool(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"The weather in {city} is 22 degrees and sunny."

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                timeout=300)
    agent = agents.Agent(
        name="weather", instructions="Use the get_weather tool to answer questions about weather.",
        tools=[get_weather], model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=60, tool_choice="required"),
        tool_use_behavior="run_llm_again", reset_tool_choice=True)
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    assert calls and all(isinstance(city, str) and city for city in calls)
    called = [item for item in result.new_items if item.type == "tool_call_item"]
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert called and outputs and "22 degrees" in outputs[0].output
    # two model turns: the forced call, then (tool_choice reset to auto) the answer, whose
    # input held the tool's output; NOTE: the 0.5B model's answer rarely quotes it
    assert len(result.raw_responses) == 2
    assert isinstance(result.final_output, str) and result.final_output
