"""Codex CLI 0.169's exchange with ``/v1/responses``, replayed in the shapes captured from
its traffic against ``inferpath serve`` (Qwen2.5-Coder-1.5B): its request fields and tools
(function tools with ``strict: false``, a ``namespace`` group, ``web_search``), the model's
call written as a bare JSON object (how the 1.5B model wrote the ``exec_command`` call that
Codex then ran), Codex's follow-up request carrying the ``function_call`` item back (with
its ``status`` and ``id``) and a ``function_call_output`` item (with an ``id``), and the
follow-up after a ``create_goal`` call, whose second ``function_call_output`` answers no
call: it names a function (``name``, ``namespace``) instead of a ``call_id``.

The answer is made to be exactly that JSON by ``text.format`` (the grammar engine), so a
135M model writes it deterministically; the server reads an answer that is one object
naming an offered tool as that call (tools.py). The references: the call's arguments are
the JSON the grammar wrote, the streamed events accumulate (``openai``'s
``responses.stream()``) to the non-streamed response's items, and the follow-up renders the
same prompt as the same conversation sent to the chat route.
"""

from __future__ import annotations

import json

import openai
import pytest

from server_harness import MODEL, client, start_server

EXEC = {"type": "object", "additionalProperties": False, "required": ["cmd"], "properties": {
    "cmd": {"type": "string", "description": "The command."},
    "justification": {"type": "string"}, "login": {"type": "boolean"},
    "max_output_tokens": {"type": "number"}, "prefix_rule": {"type": "array", "items": {"type": "string"}},
    "sandbox_permissions": {"type": "string", "enum": ["use_default", "require_escalated"]},
    "shell": {"type": "string"}, "tty": {"type": "boolean"}, "workdir": {"type": "string"},
    "yield_time_ms": {"type": "number"}}}
TARGET = {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command.",
          "strict": False, "parameters": EXEC},
         {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
          "tools": [{"type": "function", "name": "close_agent", "description": "Close one.",
                     "strict": False, "parameters": TARGET}]},
         {"type": "web_search", "external_web_access": False}]
CODEX_FIELDS = dict(tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto"},
                    store=False, include=["reasoning.encrypted_content"],
                    prompt_cache_key="01a234c3-7c7c-7e50-9848-a511ccb55822")
CLIENT_METADATA = {"client_metadata": {"session_id": "01a234c3", "turn_id": "01a234c3-7c96"}}
DEVELOPER = {"type": "message", "id": "msg_01a234c3-dev", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent."}]}
USER = {"type": "message", "id": "msg_01a234c3-user", "role": "user",
        "content": [{"type": "input_text", "text": "create a file hello.txt containing hi"}]}


def _bare_call_format(name: str, arguments: dict) -> dict:
    """text.format making the answer exactly ``{"name": name, "arguments": arguments}``."""
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": name}, "arguments": {
                  "type": "object", "additionalProperties": False, "required": list(arguments),
                  "properties": {k: {"const": v} for k, v in arguments.items()}}}}
    return {"format": {"type": "json_schema", "name": "call", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def oai():
    running = start_server()
    yield client(running)
    running.stop()


def _request(name: str, arguments: dict) -> dict:
    return dict(model=MODEL, input=[DEVELOPER, USER], tools=TOOLS, temperature=0,
                max_output_tokens=80, text=_bare_call_format(name, arguments),
                extra_body=CLIENT_METADATA, **CODEX_FIELDS)


def test_a_bare_exec_command_call_streams_as_the_function_call_item_codex_runs(oai):
    arguments = {"cmd": "echo hi > hello.txt"}
    with oai.responses.stream(**_request("exec_command", arguments)) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}  # no text item
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done = events[2].item, events[-2].item
    assert added.type == "function_call" and added.arguments == "" and added.status == "in_progress"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == arguments and done.arguments == deltas
    assert (done.name, done.call_id, done.id) == ("exec_command", added.call_id, added.id)
    assert done.call_id.startswith("call_") and done.status == "completed"
    assert "namespace" not in done.model_dump(exclude_none=True)
    assert [item.type for item in final.output] == ["function_call"] and final.status == "completed"
    assert final.output[0].arguments == deltas
    plain = oai.responses.create(**{**_request("exec_command", arguments), "stream": False})
    assert [(i.type, i.name, json.loads(i.arguments)) for i in plain.output] == \
        [("function_call", "exec_command", arguments)]


def test_a_bare_call_of_a_namespace_function_names_its_namespace(oai):
    response = oai.responses.create(**_request("multi_agent_v1.close_agent", {"target": "a1"}))
    (call,) = response.output
    assert call.type == "function_call" and call.name == "close_agent"
    assert call.model_dump()["namespace"] == "multi_agent_v1"
    assert json.loads(call.arguments) == {"target": "a1"}


def test_codex_follow_up_with_the_call_and_its_output_is_the_chat_conversation(oai):
    """Codex's second request: the earlier input, the function_call item as it came back
    (status, id), and a function_call_output item with an id of Codex's own."""
    first = oai.responses.create(**_request("exec_command", {"cmd": "echo hi > hello.txt"}))
    (call,) = first.output
    output = "Process exited with code 0\nOutput:\n"
    call_item = {"type": "function_call", "status": "completed", "id": call.id, "name": call.name,
                 "arguments": call.arguments, "call_id": call.call_id}
    result_item = {"type": "function_call_output", "id": "fco_01a234c7-bf47", "call_id": call.call_id,
                   "output": output}
    follow = oai.responses.create(model=MODEL, input=[DEVELOPER, USER, call_item, result_item],
                                  tools=TOOLS, temperature=0, max_output_tokens=8,
                                  extra_body=CLIENT_METADATA, **CODEX_FIELDS)
    assert follow.status in ("completed", "incomplete")
    chat_tools = [{"type": "function", "function": {"name": "exec_command", "description": "Run a command.",
                                                    "strict": False, "parameters": EXEC}},
                  {"type": "function", "function": {"name": "multi_agent_v1.close_agent",
                                                    "description": "Close one.", "strict": False,
                                                    "parameters": TARGET}}]
    chat = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, tools=chat_tools, messages=[
        {"role": "developer", "content": "You are a coding agent."},
        {"role": "user", "content": "create a file hello.txt containing hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "exec_command", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": output}])
    assert follow.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.output_text == chat.choices[0].message.content


GOAL = {"type": "object", "properties": {"objective": {"type": "string"}}, "required": ["objective"]}


def test_codex_goal_follow_up_with_an_output_that_names_its_function(oai):
    """Captured from Codex 0.169 after the model called create_goal: the call's output, then
    an output with ``name`` and ``namespace`` and no ``call_id`` (it was a 400 before)."""
    tools = TOOLS + [{"type": "function", "name": "create_goal", "description": "Set a goal.",
                      "strict": False, "parameters": GOAL}]
    arguments = json.dumps({"objective": "Create hello.txt"})
    items = [DEVELOPER, USER,
             {"type": "function_call", "status": "completed", "id": "fc_298b", "name": "create_goal",
              "arguments": arguments, "call_id": "call_643c"},
             {"type": "function_call_output", "id": "fco_01a234d6-ee44", "call_id": "call_643c",
              "output": '{"goal":{"objective":"Create hello.txt","status":"active"}}'},
             {"type": "function_call_output", "id": "fco_01a234d6-ee46", "name": "goal_objective",
              "namespace": "agent", "output": "Create hello.txt"}]
    follow = oai.responses.create(model=MODEL, input=items, tools=tools, temperature=0,
                                  max_output_tokens=8, extra_body=CLIENT_METADATA, **CODEX_FIELDS)
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                  for t in tools if t["type"] == "function"]
    chat_tools.insert(1, {"type": "function", "function": {
        "name": "multi_agent_v1.close_agent", "description": "Close one.", "strict": False,
        "parameters": TARGET}})
    chat = oai.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, tools=chat_tools, messages=[
        {"role": "developer", "content": "You are a coding agent."},
        {"role": "user", "content": "create a file hello.txt containing hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_643c", "type": "function",
             "function": {"name": "create_goal", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_643c", "content": items[3]["output"]},
        {"role": "tool", "name": "agent.goal_objective", "content": "Create hello.txt"}])
    assert follow.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.output_text == chat.choices[0].message.content


@pytest.mark.parametrize("item, param", [
    ({"type": "function_call_output", "output": "x"}, "input[1].call_id"),
    ({"type": "function_call_output", "namespace": "agent", "call_id": "c", "output": "x"}, "input[1].name"),
    ({"type": "function_call_output", "name": 3, "output": "x"}, "input[1].name"),
])
def test_an_output_without_a_call_or_a_function_name_is_a_400_naming_it(oai, item, param):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=MODEL, input=[USER, item], max_output_tokens=4)
    assert caught.value.body["param"] == param
