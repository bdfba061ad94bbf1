"""Anthropic's Messages API (``/v1/messages``) through the official anthropic client
against a real server over SmolLM2-135M (tests/server_harness.py). The reference is the
chat route on the same engine: the same conversation renders the same prompt and, greedy,
writes the same text.

- ``messages.create`` (system as a string or blocks) equals the chat answer; usage splits
  the prompt into computed and cache-read tokens, which sum to ``count_tokens``;
- ``messages.stream()`` gives the same text, with Anthropic's event order;
- ``stop_sequences`` and ``max_tokens`` give their stop reasons;
- ``x-api-key`` and ``Authorization: Bearer`` both authenticate; errors come in
  Anthropic's shape, naming the field.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from server_harness import MODEL, client, start_server

KEY = "test-key"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server():
    running = start_server(api_key=KEY, max_num_seqs=8)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def test_create_matches_the_chat_route_and_count_tokens(server, claude):
    question = [{"role": "user", "content": "Name a color."}]
    message = claude.messages.create(model=MODEL, max_tokens=20, system="Be brief.",
                                     messages=question, extra_body=GREEDY)
    chat = client(server, api_key=KEY).chat.completions.create(
        model=MODEL, temperature=0, max_tokens=20,
        messages=[{"role": "system", "content": "Be brief."}, *question])
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == MODEL
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    counted = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=question)
    assert counted.input_tokens == chat.usage.prompt_tokens
    # system as text blocks (with cache_control, which the prefix cache makes unneeded)
    blocks = claude.messages.create(
        model=MODEL, max_tokens=20, messages=question, extra_body=GREEDY,
        system=[{"type": "text", "text": "Be ", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "brief."}])
    assert blocks.content[0].text == message.content[0].text


def test_stream_gives_the_same_text_in_anthropics_event_order(server, claude):
    kwargs = dict(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "Say hello."}],
                  extra_body=GREEDY)
    plain = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    body = {"model": MODEL, "max_tokens": 30, "messages": kwargs["messages"], "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": KEY},
                      timeout=60) as reply:  # raw: the client drops pings
        raw = [line.removeprefix("event: ") for line in reply.iter_lines() if line.startswith("event: ")]
    assert raw[:3] == ["message_start", "ping", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[3:-3]) == {"content_block_delta"}


def test_stop_sequences_and_max_tokens_stop_reasons(claude):
    question = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    full = claude.messages.create(model=MODEL, max_tokens=40, messages=question, extra_body=GREEDY)
    text = full.content[0].text
    assert "," in text, text
    stopped = claude.messages.create(model=MODEL, max_tokens=40, messages=question,
                                     stop_sequences=[","], extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == ","
    assert stopped.content[0].text == text[:text.index(",")]
    short = claude.messages.create(model=MODEL, max_tokens=2, messages=question, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_x_api_key_and_bearer_authenticate(server):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    url = server.url + "/v1/messages"
    assert httpx.post(url, json=body, headers={"x-api-key": KEY}, timeout=60).status_code == 200
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60).status_code == 200
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=MODEL, max_tokens=2, messages=body["messages"])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "authentication_error"
    missing = httpx.post(url, json=body, timeout=60)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("change, named", [
    ({"max_tokens": None}, "max_tokens"),
    ({"container": "c1"}, "container"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
     "messages[0].content[0].extra"),
    ({"tool_choice": {"type": "tool", "name": "nope"},
      "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "nope"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"model": "other-model"}, "other-model"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management"),
], ids=lambda value: str(value)[:30])
def test_errors_are_in_anthropics_shape_naming_the_field(server, change, named):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    reply = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
    assert reply.status_code in (400, 404), reply.text
    error = reply.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == ("not_found_error" if reply.status_code == 404
                                      else "invalid_request_error")
    assert named in error["error"]["message"], error


def test_claude_codes_fields_are_accepted(server, claude):
    """The fields Claude Code 2.1 sends beside the conversation (captured from its traffic):
    accepted, and the answer is the one without them."""
    question = [{"role": "user", "content": [{"type": "text", "text": "Name a color.",
                                              "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": "Be brief."}]
    plain = claude.messages.create(model=MODEL, max_tokens=8, messages=question, extra_body=GREEDY)
    extras = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
              "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
              "metadata": {"user_id": "u1"}}
    reply = httpx.post(server.url + "/v1/messages?beta=true", headers={"x-api-key": KEY}, timeout=60,
                       json={"model": MODEL, "max_tokens": 8, "messages": question, **GREEDY, **extras})
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [block.model_dump(include={"type", "text"}) for block in plain.content]


def test_a_silent_stream_sends_pings_and_keeps_its_text(server, claude, monkeypatch):
    from inferpath.server import messages_stream

    kwargs = dict(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Say hello."}],
                  extra_body=GREEDY)
    plain = claude.messages.create(**kwargs)
    monkeypatch.setattr(messages_stream, "PING_SECONDS", 0.001)  # every wait is "silent"
    body = {"model": MODEL, "max_tokens": 12, "messages": kwargs["messages"], "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": KEY},
                      timeout=60) as reply:
        events = [line.removeprefix("event: ") for line in reply.iter_lines() if line.startswith("event: ")]
    assert events.count("ping") > 1 and events[-1] == "message_stop"
    with claude.messages.stream(**kwargs) as stream:
        assert stream.get_final_message().content[0].text == plain.content[0].text
