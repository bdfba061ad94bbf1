"""Structured output, logit_bias and refused fields, through the official openai client
against a real server over SmolLM2-135M (tests/server_harness.py).

- ``chat.completions.parse(response_format=PydanticModel)``: 20 prompts, all parsed;
- json_object parses, guided_choice / guided_regex match (chat and completions);
- 8 concurrent requests, JSON-schema rows mixed with free rows: the constrained ones are
  valid, the free ones equal their output alone (the mask touches only its rows);
- max_tokens cutting a schema answer gives finish_reason ``length``;
- logit_bias -100 removes the greedy token, +100 forces one;
- every refused field or value is a 400 naming it, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pydantic
import pytest

from server_harness import MODEL, async_client, client, start_server


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


PERSON_SCHEMA = Person.model_json_schema()
NAMES = ["Alice", "Bob", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Jules",
         "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Delhi", "Rome", "Quito", "Seoul", "Accra",
          "Lagos", "Dakar", "Hanoi", "Dublin", "Madrid", "Lisbon", "Nairobi", "Ottawa",
          "Santiago", "Vienna"]
PEOPLE = [f"{name} is {20 + 3 * i} years old and lives in {city}."
          for i, (name, city) in enumerate(zip(NAMES, CITIES))]


@pytest.fixture(scope="module")
def server():
    running = start_server(max_num_seqs=32)
    yield running
    running.stop()


def _chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_parse_with_pydantic_model_is_valid_for_20_prompts(server):
    async def one(aclient, text):
        return await aclient.chat.completions.parse(
            model=MODEL, messages=_chat(f"Extract the person: {text}"),
            response_format=Person, temperature=0, max_tokens=60)

    async def run_all():
        aclient = async_client(server)
        return await asyncio.gather(*(one(aclient, text) for text in PEOPLE))

    completions = asyncio.run(run_all())
    for completion in completions:
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Person)
        jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)
    assert len({c.choices[0].message.parsed.name for c in completions}) > 10  # really different


def test_json_object_parses_and_choice_and_regex_match(server):
    c = client(server)
    out = c.chat.completions.create(model=MODEL, messages=_chat(f"Extract the person: {PEOPLE[2]}"),
                                    response_format={"type": "json_object"},
                                    temperature=0, max_tokens=80)
    assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
    assert isinstance(json.loads(out.choices[0].message.content), dict)

    choices = ["yes", "no", "maybe"]
    out = c.chat.completions.create(model=MODEL, messages=_chat("Is the sky green?"),
                                    extra_body={"guided_choice": choices}, temperature=0, max_tokens=8)
    assert out.choices[0].message.content in choices

    pattern = r"[0-9]{3}-[0-9]{4}"
    out = c.completions.create(model=MODEL, prompt="Call me at", temperature=0.8, seed=3,
                               max_tokens=20, extra_body={"guided_regex": pattern})
    assert re.fullmatch(pattern, out.choices[0].text)
    out = c.chat.completions.create(model=MODEL, messages=_chat("A phone number?"), temperature=0,
                                    max_tokens=20, extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, out.choices[0].message.content)


def test_constrained_and_free_rows_share_a_batch(server):
    c = client(server)
    free_prompts = [f"Write one sentence about {city}." for city in CITIES[:4]]
    alone = [c.chat.completions.create(model=MODEL, messages=_chat(p), temperature=0,
                                       max_tokens=16).choices[0].message.content
             for p in free_prompts]

    async def run_mixed():
        aclient = async_client(server)
        free = [aclient.chat.completions.create(model=MODEL, messages=_chat(p), temperature=0,
                                                max_tokens=16) for p in free_prompts]
        constrained = [aclient.chat.completions.create(
            model=MODEL, messages=_chat(f"Extract the person: {text}"), temperature=0, max_tokens=60,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
            for text in PEOPLE[:4]]
        return await asyncio.gather(*free, *constrained)

    results = asyncio.run(run_mixed())
    assert [r.choices[0].message.content for r in results[:4]] == alone
    for r in results[4:]:
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON_SCHEMA)


def test_max_tokens_cutting_a_schema_answer_is_length(server):
    out = client(server).chat.completions.create(
        model=MODEL, messages=_chat(f"Extract the person: {PEOPLE[0]}"), temperature=0, max_tokens=5,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}})
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.LengthFinishReasonError):
        client(server).chat.completions.parse(model=MODEL, messages=_chat(PEOPLE[1]),
                                              response_format=Person, temperature=0, max_tokens=5)


def test_a_budget_that_cuts_the_answer_still_gets_valid_json(server):
    """Budgets below the model's own answer (and above the shortest complete one): the
    answer closes in time, parses and validates."""
    c = client(server)
    story = "Extract the person: " + PEOPLE[2] + " " + "She likes long descriptive names. " * 3

    def ask(max_tokens):
        return c.chat.completions.create(
            model=MODEL, messages=_chat(story), temperature=0, max_tokens=max_tokens,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}})

    natural = ask(60).usage.completion_tokens
    for max_tokens in (12, 14):
        assert max_tokens < natural  # the budget really cuts the model's own answer
        out = ask(max_tokens)
        assert out.usage.completion_tokens <= max_tokens
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON_SCHEMA)


def test_logit_bias_removes_and_forces_tokens(server):
    c = client(server)
    messages = _chat("Say hello.")
    greedy = c.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=4,
                                       logprobs=True)
    first = greedy.choices[0].logprobs.content[0].token
    ids = _tokenize(server, first)
    assert len(ids) == 1
    banned = c.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=4,
                                       logprobs=True, logit_bias={str(ids[0]): -100})
    assert banned.choices[0].logprobs.content[0].token != first
    forced_id = _tokenize(server, " banana")[0]
    forced = c.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=3,
                                  logit_bias={str(forced_id): 100})
    assert forced.choices[0].text == _detokenize(server, [forced_id] * 3)


def _tokenize(server, text: str) -> list[int]:
    import httpx
    return httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                      timeout=30).json()["tokens"]


def _detokenize(server, ids: list[int]) -> str:
    import httpx
    return httpx.post(server.url + "/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]


BAD_SCHEMA = {"type": "json_schema",
              "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}
REFUSED = [
    ({"frobnicate": 1}, "frobnicate"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"response_format": BAD_SCHEMA}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"guided_regex": "(("}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"stream_options": {"include_usage": True, "frobnicate": True}}, "stream_options.frobnicate"),
    ({"messages": [{"role": "user", "content": "hi", "audio": {"id": "x"}}]}, "messages.0"),
]


@pytest.mark.parametrize("extra, param", REFUSED, ids=[p for _, p in REFUSED])
def test_refused_fields_are_400_naming_them(server, extra, param):
    body = {"messages": _chat("hi"), "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model=MODEL, **{"messages": body.pop("messages")},
                                               extra_body=body)
    assert caught.value.body["param"] == param, caught.value.body
    assert caught.value.body["type"] == "invalid_request_error"


def test_completions_refuse_best_of_unless_equal_to_n(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        c.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=1, best_of=2)
    assert caught.value.body["param"] == "best_of"
    ok = c.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=2, best_of=2, temperature=0)
    assert len(ok.choices) == 2  # and the server still serves


def test_echo_with_logprobs_scores_the_prompt_like_generation_does(server):
    """Prompt token i's logprob equals the logprob of generating it after tokens < i (a
    second path of our own), also when the prompt is in the prefix cache, and streamed."""
    c = client(server)
    generated = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1,
                                     temperature=0, logprobs=1)
    next_token = generated.choices[0].logprobs.tokens[0]
    next_logprob = generated.choices[0].logprobs.token_logprobs[0]
    prompt = "The capital of France is" + next_token
    for _ in range(2):  # the second time the prompt's blocks are cached
        echoed = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                      logprobs=1, echo=True)
        logprobs = echoed.choices[0].logprobs
        num_prompt = echoed.usage.prompt_tokens
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert len(logprobs.tokens) == num_prompt + 2
        assert "".join(logprobs.tokens[:num_prompt]) == prompt
        assert logprobs.token_logprobs[num_prompt - 1] == pytest.approx(next_logprob, abs=1e-4)
    streamed_tokens, streamed_logprobs = [], []
    for chunk in c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                      logprobs=1, echo=True, stream=True):
        for choice in chunk.choices:
            if choice.logprobs:
                streamed_tokens += choice.logprobs.tokens
                streamed_logprobs += choice.logprobs.token_logprobs
    assert streamed_tokens == logprobs.tokens
    assert streamed_logprobs == pytest.approx(logprobs.token_logprobs, abs=1e-5)
