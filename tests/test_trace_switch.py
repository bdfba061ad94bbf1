"""Who may turn the trace on: ``serve --trace on|off`` (on by default on a loopback
address, off elsewhere), and what a request asking for a trace hears when it is off.

Against real servers on 127.0.0.1 (the official openai client's raw responses, httpx):
with tracing off the completion is still answered, the same greedy text as with it on,
and says ``X-Inferpath-Trace: off`` with the reason; the engine never has a tracer
attached; ``/v1/trace/{id}`` is a 403 naming the flag.
"""

from __future__ import annotations

import httpx
import pytest
from server_harness import MODEL, smollm2

from inferpath.cli.serve import tracing_allowed
from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
        "temperature": 0}


@pytest.mark.parametrize("host,flag,expected", [
    ("127.0.0.1", None, True), ("localhost", None, True), ("::1", None, True), ("127.0.0.2", None, True),
    ("0.0.0.0", None, False), ("192.168.1.5", None, False), ("my-host.example", None, False),
    ("0.0.0.0", "on", True), ("127.0.0.1", "off", False),
])
def test_the_default_is_on_for_loopback_only(host, flag, expected):
    assert tracing_allowed(flag, host) is expected


def start(tracing: bool) -> tuple[ServerThread, LLMEngine]:
    checkpoint, tokenizer, model = smollm2()
    engine = LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(), eos_token_ids=checkpoint.eos_token_ids,
                       model_name=MODEL)
    return ServerThread(build_app(AsyncEngine(engine), served_model_name=MODEL, tracing=tracing)).start(
        timeout=120), engine


@pytest.fixture(scope="module")
def servers():
    on, on_engine = start(True)
    off, off_engine = start(False)
    try:
        yield {True: (on, on_engine), False: (off, off_engine)}
    finally:
        on.stop()
        off.stop()


def ask(server: ServerThread, trace: bool) -> httpx.Response:
    headers = {"X-Inferpath-Trace": "1"} if trace else {}
    response = httpx.post(server.url + "/v1/chat/completions", json=BODY, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response


def test_with_tracing_off_a_request_asking_for_a_trace_is_answered_and_told(servers):
    (on, _), (off, off_engine) = servers[True], servers[False]
    answered = ask(off, trace=True)
    assert answered.headers["x-inferpath-trace"] == "off"
    assert "--trace on" in answered.headers["x-inferpath-trace-reason"]
    assert off_engine.tracer is None
    text = answered.json()["choices"][0]["message"]["content"]
    assert text and text == ask(on, trace=True).json()["choices"][0]["message"]["content"]
    refused = httpx.get(off.url + "/v1/trace/" + answered.json()["id"], timeout=30)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "trace_disabled" and "--trace on" in refused.json()["error"]["message"]


def test_with_tracing_on_a_traced_response_says_so_and_a_plain_one_says_nothing(servers):
    on, _ = servers[True]
    traced = ask(on, trace=True)
    assert traced.headers["x-inferpath-trace"] == "on"
    assert httpx.get(on.url + "/v1/trace/" + traced.json()["id"], timeout=30).status_code == 200
    plain = ask(on, trace=False)
    assert "x-inferpath-trace" not in plain.headers
