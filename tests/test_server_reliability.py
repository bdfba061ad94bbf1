"""One bad request never hurts another, and no input gets a 5xx (issue 13).

A real SmolLM2 server on 127.0.0.1: lone surrogates and non-ASCII API keys are 4xx,
strict types, limits on max_tokens and n name both numbers, requests with every sampling
parameter at its extremes complete or fail alone beside streams that keep their text,
/health answers while a huge prompt is tokenized, and a fuzz of request bodies never
gets a 5xx.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import string
import threading
import time
import types
import typing

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import read_metrics, start_server

from inferpath.server.messages_protocol import MessagesRequest
from inferpath.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from inferpath.server.responses_protocol import ResponsesRequest

API_KEY = "clé-secrète"  # not ASCII: compared as UTF-8 bytes
AUTH = {"Authorization": b"Bearer " + API_KEY.encode("utf-8")}
MAX_MODEL_LEN = 128
MAX_N = 4


@pytest.fixture(scope="module")
def server():
    srv = start_server(api_key=API_KEY, max_model_len=MAX_MODEL_LEN, max_n=MAX_N,
                       num_kv_blocks=64, max_num_seqs=32)
    yield srv
    srv.stop()


def post(server, path, body, headers=AUTH, timeout=120):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=timeout,
                      headers={**headers, "Content-Type": "application/json"})


def stream_texts(server, body):
    """The text deltas of a streamed completion (raw SSE: the key is not ASCII, which
    the openai client cannot send)."""
    texts = []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                      headers=AUTH, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                assert "error" not in event, event
                texts += [c["text"] for c in event["choices"]]
    return texts


def error_of(response):
    return response.json()["error"]


def test_lone_surrogates_are_400_naming_the_field(server):
    surrogate = '"abc \\ud800 def"'  # valid JSON, not valid Unicode
    for path, body in [
        ("/v1/completions", f'{{"prompt": {surrogate}, "max_tokens": 1}}'),
        ("/v1/completions", f'{{"prompt": ["ok", {surrogate}], "max_tokens": 1}}'),
        ("/tokenize", f'{{"prompt": {surrogate}}}'),
        ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": {surrogate}}}]}}'),
    ]:
        response = post(server, path, body)
        assert response.status_code == 400, (path, response.text)
        assert "surrogate" in error_of(response)["message"]


def test_api_keys_compare_as_bytes(server):
    for header in (b"Bearer \xc3\xa9t\xc3\xa9", "Bearer clé-secrète".encode("latin-1"),
                   b"Bearer \xff\xfe", b"\xc3\xa9 x", b"Bearer"):
        response = httpx.get(server.url + "/v1/models", headers={"Authorization": header})
        assert response.status_code == 401, (header, response.text)
    assert httpx.get(server.url + "/v1/models", headers=AUTH).status_code == 200


def test_docs_health_and_metrics_stay_open_under_an_api_key(server):
    """Decided as vLLM does: probes, scrapers and the API's own description are open."""
    for path in ("/health", "/metrics", "/openapi.json", "/docs"):
        assert httpx.get(server.url + path).status_code == 200, path
    assert httpx.get(server.url + "/v1/models").status_code == 401


def test_max_tokens_beyond_the_context_left_is_400_naming_both_numbers(server):
    num_prompt = len(httpx.post(server.url + "/tokenize", json={"prompt": "Hello there"},
                                headers=AUTH).json()["tokens"])
    left = MAX_MODEL_LEN - num_prompt
    response = post(server, "/v1/completions", {"prompt": "Hello there", "max_tokens": left + 1})
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "max_tokens"
    assert f"max_tokens is {left + 1}" in error["message"] and f"max_model_len is {MAX_MODEL_LEN}" in error["message"]
    assert f"{num_prompt} tokens" in error["message"]
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "max_completion_tokens": 10**6})
    assert chat.status_code == 400 and error_of(chat)["param"] == "max_completion_tokens"
    assert "max_completion_tokens is 1000000" in error_of(chat)["message"]


def test_n_above_the_cap_is_400(server):
    response = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": MAX_N + 1})
    assert response.status_code == 400 and error_of(response)["param"] == "n"
    assert f"at most {MAX_N}" in error_of(response)["message"]
    ok = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": MAX_N})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == MAX_N


@pytest.mark.parametrize("field,value", [("stream", "yes"), ("echo", "true"), ("n", "2"),
                                         ("max_tokens", 2.0), ("temperature", "0.5"),
                                         ("ignore_eos", 1), ("seed", True)])
def test_types_are_strict(server, field, value):
    response = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, field: value})
    assert response.status_code == 400 and error_of(response)["param"] == field, response.text


EXTREMES = [
    {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300}, {"temperature": 1e-5},
    {"temperature": 1e300}, {"top_p": 1e-300}, {"min_p": 1.0}, {"top_k": 1},
    {"top_k": 10**9}, {"frequency_penalty": 2, "presence_penalty": -2},
    {"logprobs": 20, "temperature": 1e300, "repetition_penalty": 1e-300},
    {"min_tokens": 4, "repetition_penalty": 1e-300}, {"seed": -(2**63)}, {"seed": 2**63 - 1},
]


def test_extreme_sampling_values_never_disturb_other_streams(server):
    """While two greedy streams decode, requests with every sampling parameter at its
    extreme accepted values complete (200) or fail alone (400); the streams' text is
    what it is alone, and no KV block is left behind."""
    prompts = ["The capital of France is", "1, 2, 3, 4,"]

    def greedy(prompt):
        return "".join(stream_texts(server, {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                             "ignore_eos": True}))

    alone = [greedy(p) for p in prompts]
    together: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, greedy(prompts[i])))
               for i in range(2)]
    for t in threads:
        t.start()
    statuses = [post(server, "/v1/completions", {"prompt": "Tell me a story", "max_tokens": 6,
                                                 **extreme}).status_code for extreme in EXTREMES]
    for t in threads:
        t.join()
    assert [together[0], together[1]] == alone
    assert set(statuses) <= {200, 400}, list(zip(EXTREMES, statuses))
    assert read_metrics(server)["inferpath:kv_blocks_used"] == 0


def test_health_answers_while_a_huge_prompt_is_tokenized(server):
    """A 1 MB prompt that is one long word (the pathological BPE case: seconds of merging)
    is tokenized off the event loop: /health keeps answering meanwhile (on the loop, it
    waited for the whole tokenization)."""
    rng = random.Random(0)
    prompt = "".join(rng.choice(string.ascii_lowercase) for _ in range(1_000_000))
    done = threading.Event()
    result = {}

    def big():
        result["response"] = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1},
                                  timeout=600)
        done.set()

    thread = threading.Thread(target=big)
    thread.start()
    latencies = []
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while not done.is_set():
            start = time.perf_counter()
            assert http.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.05)
    thread.join()
    assert result["response"].status_code == 400  # far beyond max_model_len, after tokenizing
    assert "max_model_len" in error_of(result["response"])["message"]
    assert len(latencies) >= 5, latencies  # answered many times during the tokenization
    assert statistics.median(latencies) < 0.1, latencies


_HUGE_INTEGER = "9" * 5000  # past Python's 4300-digit parse limit


class _RawNumber(str):
    """A JSON number token Python's json writes bare (NaN, Infinity, a 5,000-digit integer)."""


_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.integers(-2, 200)
    | st.sampled_from([0.0, -0.0, 1e-300, 1e300, 0.5, -1.5, 1e-5, 2.0, 1.0, 100.0])
    | st.text(max_size=8) | st.sampled_from(["user", "text", "function", "json_object",
                                             "json_schema", "auto", "none", "required"]))
_RARE_NUMBERS = st.sampled_from(["NaN", "Infinity", "-Infinity", _HUGE_INTEGER,
                                 "-" + _HUGE_INTEGER, "1e400"]).map(lambda s: _RawNumber(s))
_JSON_VALUES = st.recursive(
    st.one_of(_SCALARS, _SCALARS, _SCALARS, _RARE_NUMBERS),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4) | st.sampled_from(
        ["role", "content", "type", "text", "name", "schema", "json_schema", "function",
         "include_usage", "parameters", "json", "regex", "choice"]), children, max_size=3),
    max_leaves=6)


def _field_names(model) -> list[str]:
    """Every field a request model accepts, as the client spells it (aliases)."""
    return sorted({field.alias or name for name, field in model.model_fields.items()})


_SIMPLE_TYPES = (int, float, bool, str, list, dict, type(None), typing.Literal)
#: valid values of the fields whose type is a model of its own, to reach past validation
_EXAMPLES = {
    "model": ["smollm2-135m-instruct"],
    "response_format": [{"type": "json_object"}, {"type": "text"}, {"type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
            "a": {"type": "integer"}}, "required": ["a"]}}}],
    "structured_outputs": [{"regex": "[ab]{1,3}"}, {"choice": ["yes", "no"]}],
    "guided_json": [{"type": "array", "items": {"type": "number"}, "maxItems": 2}],
    "stream_options": [{"include_usage": True}],
    "tools": [[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}}]],
    "tool_choice": [{"type": "function", "function": {"name": "f"}}],
    "messages": [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]],
}


def _typed_values(annotation):
    """Values of a field's own type (st.from_type: unbounded integers, NaN and infinite
    floats...) when it is built of plain types; else the field's valid examples."""
    if _typed_ok(annotation):
        return st.from_type(annotation)
    return st.nothing()


def _typed_ok(annotation) -> bool:
    if annotation is typing.Any:
        return False
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation) or annotation
    if origin is typing.Literal:
        return True
    return origin in _SIMPLE_TYPES and all(_typed_ok(a) for a in args) or (
        origin in (typing.Union, types.UnionType) and all(_typed_ok(a) for a in args))


def _field_values(model) -> dict[str, st.SearchStrategy]:
    """Every field a request model accepts, as the client spells it (aliases), with what
    to send in it: any JSON value, a value of its type, or a valid example."""
    return {field.alias or name: st.one_of(_JSON_VALUES, _typed_values(field.annotation),
                                           st.sampled_from(_EXAMPLES.get(name, [None])))
            for name, field in model.model_fields.items()}


#: route -> (a valid body, the fields of its request model)
_ROUTES = {
    "/v1/completions": ({"prompt": "Hi", "max_tokens": 2}, _field_values(CompletionRequest)),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                             _field_values(ChatCompletionRequest)),
    "/tokenize": ({"prompt": "Hi"}, _field_values(TokenizeRequest)),
    "/detokenize": ({"tokens": [1, 2]}, _field_values(DetokenizeRequest)),
    "/v1/responses": ({"input": "Hi", "max_output_tokens": 2}, _field_values(ResponsesRequest)),
    "/v1/messages": ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                     _field_values(MessagesRequest)),
    "/v1/messages/count_tokens": ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                                  _field_values(MessagesRequest)),
}


@st.composite
def _request_bodies(draw):
    path = draw(st.sampled_from(sorted(_ROUTES)))
    base, fields = _ROUTES[path]
    names = draw(st.lists(st.sampled_from([*fields, "not_a_field"]), max_size=4, unique=True))
    changed = {name: draw(fields.get(name, _JSON_VALUES)) for name in names}
    return path, {**base, **changed}


def _dump(value) -> str:
    if isinstance(value, _RawNumber):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + _dump(v) for k, v in value.items()) + "}"
    return json.dumps(value)


def assert_names_a_sent_field(response, body: dict) -> None:
    """A 400 to a well-formed JSON body names the field it refuses (``param``), a field the
    body holds, and says its name in the message."""
    error = error_of(response)
    if response.json().get("type") == "error":  # Anthropic's shape has no param: the message names it
        assert any(name in error["message"] for name in body), (body, error)
        return
    assert error["param"], (body, error)
    root = re.split(r"[.\[]", error["param"])[0]  # "tools.0.x" (chat) or "tools[0].x" (Responses)
    assert root in body, (body, error)
    assert root in error["message"], (body, error)


def test_a_5000_digit_integer_is_400_naming_the_field_and_the_limit(server):
    for path, body in [("/v1/completions", {"prompt": "Hi", "max_tokens": _RawNumber(_HUGE_INTEGER)}),
                       ("/v1/completions", {"prompt": [1, _RawNumber(_HUGE_INTEGER)]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "seed": _RawNumber("-" + _HUGE_INTEGER)})]:
        response = post(server, path, _dump(body))
        assert response.status_code == 400, response.text
        error = error_of(response)
        field = next(k for k, v in body.items() if _HUGE_INTEGER in _dump(v))
        assert error["param"].split(".")[0] == field, error
        assert "5000 digits" in error["message"] and "at most 4300 digits" in error["message"]
    not_utf8 = post(server, "/v1/completions", b'{"prompt": "\xff", "max_tokens": 1}')
    assert not_utf8.status_code == 400 and "UTF-8" in error_of(not_utf8)["message"], not_utf8.text
    deep = post(server, "/v1/completions", '{"prompt": "Hi", "stop": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert deep.status_code == 400 and "deeply" in error_of(deep)["message"], deep.text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(_request_bodies())
def test_no_request_body_gets_a_5xx_or_an_unnamed_400(server, request_body):
    """Every field of completions, chat completions, (de)tokenize, Responses and Messages
    (read from the request models, so a new field is fuzzed too) with values of every JSON
    type, huge integers among them: never a 5xx, and every 400 names a field the body holds."""
    path, body = request_body
    response = post(server, path, _dump(body), timeout=120)
    assert response.status_code < 500, (path, _dump(body), response.text)
    if response.status_code == 400:
        assert_names_a_sent_field(response, body)
