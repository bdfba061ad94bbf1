"""Sampling defaults for the fields a request leaves out (server/generation_defaults.py):
``serve --generation-config auto|none`` reads the model directory's generation_config.json,
``--override-generation-config`` adds keys on top, and a key inferpath does not apply is an
error naming it.

Against a real server on 127.0.0.1 (SmolLM2, the official openai and anthropic clients):
with the default ``temperature 0`` a request without a temperature on every route gives the
greedy answer, and a request that sets its own temperature keeps it (its seeded sample
equals the same request on a server without defaults).
"""

from __future__ import annotations

import argparse
import json

import anthropic
import pytest
from server_harness import MODEL, smollm2

from inferpath.cli.serve import sampling_defaults_from_args
from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.generation_defaults import parse_override, read_generation_defaults
from inferpath.server.launch import ServerThread

import openai


def test_auto_reads_the_sampling_keys_of_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.7,
        "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "transformers_version": "4.49"}))
    assert read_generation_defaults(tmp_path) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                  "repetition_penalty": 1.05}
    assert read_generation_defaults(tmp_path, "none") == {}
    assert read_generation_defaults(tmp_path / "missing") == {}  # a GGUF file, an alias: none
    args = argparse.Namespace(generation_config="auto", override_generation_config='{"top_k": 40, "min_p": 0.05}')
    assert sampling_defaults_from_args(args, str(tmp_path)) == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.05}


@pytest.mark.parametrize("text,message", [
    ('{"max_new_tokens": 64}', "'max_new_tokens' is not a sampling default"),
    ('{"top_k": 2.5}', "top_k is 2.5; it must be a int"),
    ('{"temperature": "hot"}', "temperature is 'hot'"),
    ('[0.7]', "must be a JSON object"),
    ('{temperature: 1}', "is not JSON"),
])
def test_an_override_inferpath_does_not_apply_is_refused_by_name(text, message):
    with pytest.raises(ValueError, match=message):
        parse_override(text)


def test_a_bad_generation_config_is_refused(tmp_path):
    (tmp_path / "generation_config.json").write_text('{"temperature": "warm"}')
    with pytest.raises(ValueError, match="temperature is 'warm'"):
        read_generation_defaults(tmp_path)
    with pytest.raises(ValueError, match="--generation-config is 'vllm'"):
        read_generation_defaults(tmp_path, "vllm")


@pytest.fixture(scope="module")
def servers():
    checkpoint, tokenizer, model = smollm2()
    started = []
    for defaults in ({"temperature": 0.0}, None):
        engine = LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(),
                           eos_token_ids=checkpoint.eos_token_ids, model_name=MODEL)
        app = build_app(AsyncEngine(engine), served_model_name=MODEL, sampling_defaults=defaults)
        started.append(ServerThread(app).start(timeout=120))
    yield started
    for server in started:
        server.stop()


def test_a_default_fills_only_the_fields_a_request_leaves_out(servers):
    defaulted, plain = (openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused") for s in servers)
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    greedy = plain.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    left_out = defaulted.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
    assert left_out.choices[0].message.content == greedy.choices[0].message.content
    # the request's own temperature wins: its seeded sample is the plain server's
    own = [c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=1.0, seed=7)
           for c in (defaulted, plain)]
    assert own[0].choices[0].message.content == own[1].choices[0].message.content
    # every route: completions, responses, messages
    text = plain.completions.create(model=MODEL, prompt="The sea is", max_tokens=12, temperature=0)
    assert defaulted.completions.create(model=MODEL, prompt="The sea is", max_tokens=12).choices[0].text \
        == text.choices[0].text
    answer = plain.responses.create(model=MODEL, input="Name a fish.", max_output_tokens=12, temperature=0)
    assert defaulted.responses.create(model=MODEL, input="Name a fish.", max_output_tokens=12).output_text \
        == answer.output_text
    claude = [anthropic.Anthropic(base_url=s.url, api_key="unused") for s in servers]
    ask = {"model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "Name a bird."}]}
    assert claude[0].messages.create(**ask).content[0].text \
        == claude[1].messages.create(**ask, extra_body={"temperature": 0}).content[0].text


def test_serve_takes_the_flags():
    from inferpath.cli import build_parser

    args = build_parser().parse_args(["serve", MODEL, "--override-generation-config", '{"top_k": 5}'])
    assert args.generation_config == "auto"
    assert sampling_defaults_from_args(args, MODEL) == {"top_k": 5}  # an alias: no generation_config.json
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--generation-config", "vllm"])
