"""Tensor parallelism across hosts through torchrun: two torchrun agents on 127.0.0.1 as
two "nodes" (``--nnodes 2 --nproc-per-node 1``, c10d rendezvous) run ``inferpath serve
DIR --tp 2``; rank 0 serves HTTP, rank 1 runs the worker loop, gloo between them. Its
greedy completions equal one process's (``tensor_parallel_size=1``) on the same weights.

The model is a tiny random Llama (2 layers, 4 query / 2 KV heads: SmolLM2's 3 KV heads do
not split in two) with Llama-3's tokenizer, built by transformers offline.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import transformers

import inferpath
from gguf_convert import save_tiny

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama-tp")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128256, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)
    save_tiny(config, directory, "llama3")
    return directory


def _agent(model: Path, rdzv_port: int, http_port: int, is_host: bool) -> subprocess.Popen:
    torchrun = shutil.which("torchrun") or "torchrun"
    src = str(Path(inferpath.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    command = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", "inferpath-tp-test",
               # both agents run on this host: say which one hosts the rendezvous store
               "--rdzv-conf", f"is_host={int(is_host)}",
               "-m", "inferpath", "serve", str(model), "--tp", "2", "--dtype", "float32",
               "--threads", "1", "--port", str(http_port), "--kv-cache-memory", "0.03125",
               "--log-level", "warning"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(agents: list[subprocess.Popen]) -> str:
    output = []
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGINT)  # the group this test started
    for agent in agents:
        try:
            out, _ = agent.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            out, _ = agent.communicate()
        output.append(out.decode(errors="replace"))
    return "\n".join(output)


def test_two_torchrun_nodes_tp2_equal_one_process(tiny_llama):
    from inferpath import LLM, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    single = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_bytes=32 * 1024**2, threads=1)
    expected = [out.outputs[0].text for out in single.generate(PROMPTS, params)]

    http_port, rdzv_port = _free_port(), _free_port()
    agents = [_agent(tiny_llama, rdzv_port, http_port, True),
              _agent(tiny_llama, rdzv_port, http_port, False)]
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            exited = [a.returncode for a in agents if a.poll() is not None]
            assert not exited and time.monotonic() < deadline, _stop(agents)
            time.sleep(0.5)
        model_id = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        got = []
        for prompt in PROMPTS:
            response = httpx.post(url + "/v1/completions", timeout=120, json={
                "model": model_id, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True})
            assert response.status_code == 200, response.text
            got.append(response.json()["choices"][0]["text"])
    finally:
        output = _stop(agents)
    # NOTE: the agents' exit codes say nothing here: torchrun exits non-zero on the SIGINT
    # that stops it
    assert got == expected, output
