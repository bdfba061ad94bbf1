"""guidellm (vLLM's benchmark tool, a test extra) runs a short benchmark against the server,
offline, with the served model's default id (its Hugging Face id).

guidellm loads the tokenizer of the id the server reports (``/v1/models``) through
``transformers``; with no hub here, the test puts SmolLM2's tokenizer (transformers reads it
from the same GGUF file) into a Hugging Face cache of its own and sets HF_HUB_OFFLINE.
Four synchronous streamed requests of 32 synthetic prompt tokens and 8 output tokens must
all complete (guidellm sends vLLM's ``stream_options.continuous_usage_stats``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from inferpath.models import resolve_model, served_model_name
from server_harness import MODEL, start_server

HF_ID = served_model_name(MODEL)


@pytest.fixture(scope="module")
def server():
    running = start_server(served_model_name=HF_ID)
    yield running
    running.stop()


def _hf_cache_with_tokenizer(root) -> None:
    """A Hugging Face cache holding HF_ID's tokenizer, converted from our GGUF file."""
    from transformers import AutoTokenizer

    gguf = resolve_model(MODEL)
    snapshot = root / f"models--{HF_ID.replace('/', '--')}" / "snapshots" / "local"
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("local")


def test_guidellm_benchmark_runs_offline_with_the_default_model_id(server, tmp_path):
    _hf_cache_with_tokenizer(tmp_path / "hub")
    guidellm = shutil.which("guidellm") or pytest.fail("guidellm is not installed (test extra)")
    out = tmp_path / "guidellm.json"
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [guidellm, "run", "--backend", f"kind=openai_http,target={server.url}",
         "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=8",
         "--profile", "kind=synchronous", "--constraint", "kind=max_requests,count=4",
         "--disable-console-interactive", "--output", f"kind=json,path={out}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    totals = report["benchmarks"][0]["metrics"]["request_totals"]
    assert totals["successful"] == 4 and totals["errored"] == 0, totals
