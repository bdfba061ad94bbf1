"""The Responses API (``/v1/responses``) through the official openai client against a real
server over SmolLM2-135M (tests/server_harness.py). The reference is the chat route on the
same engine: a Responses request and the chat request with the same messages render the
same prompt and, greedy, write the same text.

- string input, item-list input and ``instructions`` (the chat route's system message);
- ``responses.stream()`` accumulates the same text as the non-streamed response, with
  consecutive sequence numbers and OpenAI's event order;
- ``responses.parse(text_format=Pydantic)`` is valid for 10 prompts;
- ``store`` + ``retrieve`` + ``input_items`` + ``delete``; ``previous_response_id``
  carries the conversation (the same prompt as sending it whole; the prefix cache reads
  it); an evicted id is a 404 that says so;
- Codex's extra fields and hosted tools are accepted with warnings; any other field a 400
  naming it.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import jsonschema
import openai
import pydantic
import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread
from inferpath.server.response_store import ResponseNotFound, ResponseStore, StoredResponse
from server_harness import MODEL, async_client, client, smollm2, start_server

GREEDY = {"temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def server():
    running = start_server(max_num_seqs=16)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def oai(server):
    return client(server)


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_string_items_and_instructions_match_the_chat_route(oai):
    by_string = oai.responses.create(model=MODEL, input="Name a color.", **GREEDY)
    by_items = oai.responses.create(model=MODEL, input=[_user("Name a color.")], **GREEDY)
    assert by_string.output_text and by_string.output_text == by_items.output_text
    assert by_string.usage.input_tokens == by_items.usage.input_tokens
    assert by_string.output[0].type == "message" and by_string.output[0].role == "assistant"

    answer = oai.responses.create(model=MODEL, instructions="Answer in French.",
                                  input=[_user("Hello, who are you?")], **GREEDY)
    chat = oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=GREEDY["max_output_tokens"],
        messages=[{"role": "system", "content": "Answer in French."},
                  {"role": "user", "content": "Hello, who are you?"}])
    assert answer.output_text == chat.choices[0].message.content
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    assert answer.usage.output_tokens == chat.usage.completion_tokens
    assert answer.instructions == "Answer in French."
    assert answer.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_length_stop_is_incomplete_with_its_reason(oai):
    response = oai.responses.create(model=MODEL, input="Tell me a long story.", temperature=0,
                                    max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


def test_stream_accumulates_the_same_text_with_ordered_events(oai):
    kwargs = dict(model=MODEL, input="Write one short sentence about the sea.", temperature=0,
                  max_output_tokens=60, extra_body={"stop": ["."]})
    plain = oai.responses.create(**kwargs)
    assert plain.status == "completed"
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == plain.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.id == events[0].response.id


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


PEOPLE = ["Alice is 31 and lives in Paris.", "Bob, 45, Tokyo.", "Chen lives in Lima, aged 22.",
          "Dana (60) is from Cairo.", "Emil is 19, in Oslo.", "Fatima is a 38 year old in Delhi.",
          "Goran, 27, lives in Rome.", "Hana is 52 and lives in Seoul.", "Ivan, Accra, 33.",
          "Jules is 41 and lives in Dublin."]


def test_parse_with_pydantic_text_format_is_valid_for_10_prompts(server):
    async def run_all():
        aclient = async_client(server)
        return await asyncio.gather(*(
            aclient.responses.parse(model=MODEL, input=f"Extract the person: {text}",
                                    text_format=Person, temperature=0, max_output_tokens=60)
            for text in PEOPLE))

    for response in asyncio.run(run_all()):
        assert isinstance(response.output_parsed, Person), response.output_text
        jsonschema.validate(response.output_parsed.model_dump(), Person.model_json_schema())


def test_json_object_format_gives_an_object(oai):
    response = oai.responses.create(model=MODEL, input="A JSON object describing a cat.",
                                    text={"format": {"type": "json_object"}}, temperature=0,
                                    max_output_tokens=40)
    import json

    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:
        assert response.output_text.lstrip().startswith("{")


def test_store_retrieve_input_items_and_delete(oai):
    created = oai.responses.create(model=MODEL, input=[_user("Hi"), _user("Name a fruit.")], **GREEDY)
    fetched = oai.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    items = oai.responses.input_items.list(created.id, order="asc")
    assert [item.content[0].text for item in items.data] == ["Hi", "Name a fruit."]
    assert all(item.id for item in items.data)
    newest_first = oai.responses.input_items.list(created.id)
    assert [item.content[0].text for item in newest_first.data] == ["Name a fruit.", "Hi"]
    oai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError, match="deleted"):
        oai.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError, match="deleted"):
        oai.responses.create(model=MODEL, input="more", previous_response_id=created.id)
    unstored = oai.responses.create(model=MODEL, input="Hi", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError, match="never stored"):
        oai.responses.retrieve(unstored.id)


def test_previous_response_id_carries_the_conversation(oai):
    first = oai.responses.create(model=MODEL, instructions="Be brief.", input="Name a fruit.",
                                 **GREEDY)
    second = oai.responses.create(model=MODEL, previous_response_id=first.id,
                                  input="And a vegetable?", **GREEDY)
    whole = oai.responses.create(
        model=MODEL, store=False, **GREEDY,
        input=[_user("Name a fruit."),
               {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": first.output_text}]},
               _user("And a vegetable?")])
    assert second.previous_response_id == first.id
    # instructions are not carried over (as OpenAI), so the two prompts are the same
    assert second.usage.input_tokens == whole.usage.input_tokens
    assert second.output_text == whole.output_text
    assert whole.usage.input_tokens_details.cached_tokens > 0  # the shared prefix was cached


def test_an_evicted_response_is_a_404_that_says_so():
    checkpoint, tokenizer, model = smollm2()
    engine = LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(),
                       eos_token_ids=checkpoint.eos_token_ids, model_name=MODEL)
    app = build_app(AsyncEngine(engine), served_model_name=MODEL,
                    response_store=ResponseStore(max_responses=2))
    with ServerThread(app) as running:
        oai = client(running)
        ids = [oai.responses.create(model=MODEL, input=f"Say {word}.", temperature=0,
                                    max_output_tokens=2).id for word in ("one", "two", "three")]
        with pytest.raises(openai.NotFoundError, match="evicted"):
            oai.responses.retrieve(ids[0])
        with pytest.raises(openai.NotFoundError, match="evicted") as caught:
            oai.responses.create(model=MODEL, input="x", previous_response_id=ids[0])
        assert caught.value.body["param"] == "previous_response_id"
        assert oai.responses.retrieve(ids[2]).id == ids[2]


def test_store_is_bounded_by_bytes_and_count():
    def entry(response_id: str, text: str) -> StoredResponse:
        return StoredResponse({"id": response_id}, [], [{"role": "user", "content": text}])

    store = ResponseStore(max_responses=10, max_bytes=350)
    assert store.put(entry("a", "x" * 100)) and store.put(entry("b", "y" * 100))
    assert store.put(entry("c", "z" * 100))  # 3 x 151 bytes > 350: "a" goes
    assert len(store) == 2 and store.num_bytes <= 350
    with pytest.raises(ResponseNotFound, match="evicted"):
        store.get("a")
    assert not store.put(entry("huge", "w" * 400))  # larger than the whole store
    with pytest.raises(ResponseNotFound, match="never stored"):
        store.get("huge")
    counted = ResponseStore(max_responses=1)
    counted.put(entry("a", "")), counted.put(entry("b", ""))
    assert len(counted) == 1 and counted.get("b")


def test_codex_fields_and_hosted_tools_are_accepted_with_warnings(oai, caplog):
    caplog.set_level(logging.WARNING, logger="inferpath.server.responses")
    response = oai.responses.create(
        model=MODEL, input=[{**_user("Hi"), "id": "msg_1"}], store=False, stream=False,
        tools=[{"type": "web_search", "external_web_access": False}], tool_choice="auto",
        parallel_tool_calls=True, include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"}, prompt_cache_key="session-1", temperature=0,
        max_output_tokens=4, extra_body={"client_metadata": {"thread_id": "t1"}})
    warnings = " | ".join(response.model_extra["warnings"])
    for name in ("web_search", "include", "reasoning", "prompt_cache_key", "client_metadata"):
        assert name in warnings
    assert response.id in caplog.text and "web_search" in caplog.text
    assert response.output_text


@pytest.mark.parametrize("extra, param", [
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools[0].defer_loading"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
], ids=lambda value: str(value)[:30])
def test_unimplemented_fields_are_400_naming_them(oai, extra, param):
    body = {"input": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        oai.post("/responses", body=body, cast_to=object)
    assert caught.value.body["param"] == param, caught.value.body
    assert oai.responses.create(model=MODEL, input="Hi", max_output_tokens=1).status  # still serving


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 4, "temperature": 0}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "temperature": 0,
                      "messages": [{"role": "user", "content": "Hi"}]}),
], ids=["responses", "messages"])
def test_responses_and_messages_are_traced_by_the_glass_box(server, path, body):
    reply = httpx.post(server.url + path, json=body, headers={"X-Inferpath-Trace": "1"}, timeout=120)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    trace = httpx.get(f"{server.url}/v1/trace/{answer['id']}", timeout=60)
    assert trace.status_code == 200, trace.text
    num_tokens = answer["usage"]["output_tokens"]
    assert sum(1 for step in trace.json()["steps"] if step["token"]) == num_tokens


def test_a_codex_shaped_streamed_request_completes(oai):
    """The shape of Codex CLI 0.169's first request (captured from its traffic; the texts
    here are stand-ins): developer messages with ids, function tools with strict false, a
    namespace group, web_search, and its extra fields; streamed."""
    schema = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
              "additionalProperties": False}
    tools = [{"type": "function", "name": "exec_command", "description": "Run a command.",
              "strict": False, "parameters": schema},
             {"type": "namespace", "name": "agents", "description": "Sub-agents.",
              "tools": [{"type": "function", "name": "spawn", "description": "Start one.",
                         "strict": False, "parameters": schema}]},
             {"type": "web_search", "external_web_access": False}]
    developer = {"type": "message", "id": "msg_dev", "role": "developer",
                 "content": [{"type": "input_text", "text": "You are a coding agent."}]}
    with oai.responses.stream(
            model=MODEL, input=[developer, {**_user("Say hi."), "id": "msg_user"}], tools=tools,
            tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto"},
            store=False, include=["reasoning.encrypted_content"], prompt_cache_key="thread-1",
            temperature=0, max_output_tokens=200, extra_body={"stop": ["."],
                                                           "client_metadata": {"thread_id": "t"}}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[-1].type == "response.completed" and final.status == "completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "web_search" in " ".join(final.model_extra["warnings"])
    assert final.output and final.usage.input_tokens > 0
