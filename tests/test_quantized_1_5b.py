"""The benchmark-sized K-quant file: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Q4_K + Q6_K, 1.12 GB).

It is pulled on demand only (``inferpath models pull qwen2.5-coder-1.5b-instruct``), never
by ``scripts/test.sh``: each test here skips, saying so, when it is not in the cache.

- Teacher-forced over 520 tokens of text, every row through the fused int8 kernels (the
  520 rows together, or each alone: what a decode step runs; the Q6_K LM head included),
  against the same file dequantized to float32: top-1 agreement >= 99%, perplexity within
  1% (test_quantized.py's check, at this size).
- Resident memory of the quantized model, loaded and run by the engine in a fresh
  process: what it adds <= 1.1x the file (the blocks are read in place from the mapped
  file, or repacked by 8 rows with the mapped pages under them dropped; both are
  measured; nothing is dequantized beside them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from inferpath import models
from inferpath.kernels import build
from inferpath.kernels.repacked import REPACK_LEVELS

ALIAS = "qwen2.5-coder-1.5b-instruct"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def path():
    found = models.local_path(ALIAS)
    if found is None:
        pytest.skip(f"{ALIAS} is not pulled (1.12 GB, on demand only: `inferpath models pull {ALIAS}`)")
    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    return found


@pytest.mark.parametrize("rows_alone,repacked", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["rows-together", "rows-alone", "rows-together-repacked", "rows-alone-repacked"])
def test_the_1_5b_file_agrees_with_its_dequantized_self(path, rows_alone, repacked):
    """Each case in a fresh process: the quantized model beside its 6.2 GB float32 self, on
    top of what a whole suite's process already holds, OOM-killed the suite on a 24 GB
    machine; alone a case peaked at 9.6 GB and gives its memory back when it ends."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from test_quantized import test_real_model_quantized_agrees_with_its_dequantized_self as agrees; "
            f"agrees({ALIAS!r}, fused_head=True, rows_alone={rows_alone}, repacked={repacked})")
    done = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


RSS_SCRIPT = """
import json, sys
from pathlib import Path
def rss_mb():
    line = next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('VmRSS:'))
    return int(line.split()[1]) / 1024
import inferpath, torch
from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.sampling.params import SamplingParams
before = rss_mb()
engine = LLMEngine.from_model(sys.argv[1], EngineConfig(threads=2, max_num_seqs=1, kv_cache_memory_bytes=8 << 20))
engine.add_request('r', 'def fibonacci(n):', SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
print(json.dumps({'added_mb': rss_mb() - before, 'format': engine.weight_format.describe(),
                  'repacked': list(engine.weight_plan.repacked)}))
"""


@pytest.mark.parametrize("repack", ["1", "0"], ids=["repacked", "as-laid-out"])
def test_the_1_5b_model_is_resident_within_1_1x_its_file(path, repack):
    """Decode steps touch every weight but the embedding table's unread rows; the KV cache
    (8 MiB) and the activations are the rest. Both layouts: repacked by 8 rows
    (INFERPATH_REPACK=1, where the kernels are SIMD) and the file's (0)."""
    done = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "INFERPATH_REPACK": repack})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    file_mb = path.stat().st_size / 2**20
    assert "Q4_K" in got["format"] and "Q6_K" in got["format"], got["format"]
    simd = build.kernel_level("quantized") in REPACK_LEVELS
    assert set(got["repacked"]) == ({"Q4_K", "Q6_K"} if repack == "1" and simd else set()), got
    assert got["added_mb"] <= 1.1 * file_mb, (got, file_mb)


@pytest.mark.parametrize("tail", [2, 12], ids=["tail-2", "tail-12"])
def test_a_prefix_cache_hit_gives_the_cold_prompts_bits(path, tail):
    """The same greedy request twice with prefix caching: the second computes only the
    prompt's tail past its cached blocks, under R8_GEMM_MIN_ROWS rows (r8.c's tiles where
    the cold prompt took gemm.c's panels), and its tokens and logprobs are the first's to
    the bit: the GEMM runs r8.c's float order for every K-quant (Q6_K's halves included;
    before, a repeat of the same request could break a near tie differently)."""
    from inferpath.config import EngineConfig
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.tokenizer import load_tokenizer
    from test_repacked_gemm import greedy_twice_with_prefix_caching, skip_unless_tails_meet_x_as_prompts

    engine = LLMEngine.from_model(path, EngineConfig(threads=2, enable_prefix_caching=True,
                                                     kv_cache_memory_bytes=64 * 2**20))
    block = engine.runner.kv_cache.k_caches[0].shape[1]
    text = "Write a Python function that parses a CSV file with a header row into a list of dictionaries. " * 4
    prompt = load_tokenizer(path).encode(text)[:2 * block + tail]
    assert len(prompt) == 2 * block + tail >= 17  # the cold prompt takes the GEMM (R8_GEMM_MIN_ROWS rows)
    skip_unless_tails_meet_x_as_prompts(len(prompt), tail)
    hits = engine.stats().prefix_cache_hits
    cold, warm, computed = greedy_twice_with_prefix_caching(engine, prompt)
    assert engine.stats().prefix_cache_hits - hits == 2 * block  # only the tail computed
    assert computed == tail
    assert warm == cold
