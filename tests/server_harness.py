"""Real inferpath servers on 127.0.0.1 for the server tests (imported by test_server*.py).

The SmolLM2 weights are loaded once per test session and shared by every engine the
tests build (the model's forward keeps no state; each engine has its own KV cache), so
a second server with a tiny KV budget costs no second load.
"""

from __future__ import annotations

import functools

import httpx
import openai
import torch
from prometheus_client.parser import text_string_to_metric_families

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.model import build_model
from inferpath.models import resolve_model
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread
from inferpath.tokenizer import load_tokenizer
from inferpath.weights import load_checkpoint

MODEL = "smollm2-135m-instruct"


@functools.cache
def smollm2() -> tuple:
    """(checkpoint, tokenizer, model) of SmolLM2-135M-Instruct, fp32, loaded once."""
    checkpoint = load_checkpoint(resolve_model(MODEL), dtype=torch.float32)
    tokenizer = load_tokenizer(checkpoint.tokenizer_path)
    model = build_model(checkpoint, torch.float32)
    return checkpoint, tokenizer, model


def start_server(api_key: str | None = None, max_n: int = 128, served_model_name: str = MODEL,
                 **engine_config) -> ServerThread:
    """A started server over a fresh engine (EngineConfig(**engine_config)) on a free port."""
    checkpoint, tokenizer, model = smollm2()
    engine = LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(**engine_config),
                       eos_token_ids=checkpoint.eos_token_ids, model_name=MODEL)
    app = build_app(AsyncEngine(engine), api_key=api_key, served_model_name=served_model_name,
                    max_n=max_n)
    return ServerThread(app).start(timeout=120)


def client(server: ServerThread, api_key: str = "unused", **kwargs) -> openai.OpenAI:
    """The official client, without retries (a 429 must reach the test)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0,
                         timeout=120, **kwargs)


def async_client(server: ServerThread, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0,
                              timeout=120)


def read_metrics(server: ServerThread) -> dict[str, float]:
    """/metrics as {'name{label="v"}': value} (label-less samples as plain 'name'). Every
    sample must carry the served model's ``model_name`` (vLLM's label); it is left out of
    the keys."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name.startswith("inferpath:"):
                assert sample.labels.get("model_name") == MODEL, sample
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())
                              if k != "model_name")
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def tokenize(server: ServerThread, headers: dict | None = None, **body) -> list[int]:
    response = httpx.post(server.url + "/tokenize", json=body, headers=headers or {}, timeout=30)
    response.raise_for_status()
    return response.json()["tokens"]
