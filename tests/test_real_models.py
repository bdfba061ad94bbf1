"""Real models: our loader and Transformer against transformers loading the same GGUF file.

For SmolLM2-135M-Instruct (Llama, Q4_1 + Q8_0) and, under the slow marker,
Qwen2.5-Coder-0.5B-Instruct (Qwen2, Q5_0/Q8_0/Q4_K/Q6_K), transformers dequantizes the
same file (``from_pretrained(folder, gguf_file=...)``, float32) and is the reference for:

- every tensor of the checkpoint (after our Q/K un-permutation): equal within 1e-6;
- prefill logits of 3 prompts, at every position: max |ours - ref| <= 1e-3 (absolute, in
  logit units; the logits themselves span tens of units);
- a greedy continuation of 64 tokens (EOS ignored): the same token ids.

Our model runs one sequence over a paged KVCache with hand-built AttentionMetadata.
Each reference model is loaded once per module; torch uses 2 threads here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gguf
import numpy as np
import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.model import AttentionMetadata, Transformer, build_model
from inferpath.models import resolve_model
from inferpath.tokenizer import Tokenizer, load_tokenizer
from inferpath.weights import Checkpoint, load_checkpoint

import transformers  # test-only reference; a hard dependency of the test extras

BLOCK_SIZE = 16
NUM_BLOCKS = 16  # 256 tokens: the longest prompt plus 64 generated ones
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
QUESTION = [{"role": "user", "content": "What is a quadratic equation?"}]
NUM_GREEDY_TOKENS = 64


@dataclass
class RealModel:
    checkpoint: Checkpoint
    ours: Transformer
    reference: torch.nn.Module
    tokenizer: Tokenizer


def _fast_reference_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speed up transformers' GGUF loading without changing what it computes.

    transformers rebuilds gguf's TensorNameMap (a pure function of architecture and block
    count) for every module it visits, and GGUFReader slices the file as np.memmap views,
    whose bookkeeping dominates parsing a large vocabulary. Memoize the first; make the
    second use a plain ndarray view of the same mapped bytes.
    """
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    original_get = gguf.GGUFReader._get

    def get_from_plain_view(self, *args, **kwargs):
        if type(self.data) is np.memmap:
            self.data = self.data.view(np.ndarray)
        return original_get(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "_get", get_from_plain_view)


@pytest.fixture(scope="module", params=[
    "smollm2-135m-instruct",
    pytest.param("qwen2.5-coder-0.5b-instruct", marks=pytest.mark.slow),
])
def real(request: pytest.FixtureRequest) -> RealModel:
    num_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    path = resolve_model(request.param)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fast_reference_parsing(monkeypatch)
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    checkpoint = load_checkpoint(path)
    yield RealModel(checkpoint, build_model(checkpoint), reference, load_tokenizer(checkpoint.tokenizer_path))
    torch.set_num_threads(num_threads)


def single_sequence_meta(start: int, num_new: int) -> AttentionMetadata:
    """Metadata for tokens start..start+num_new-1 of one sequence owning blocks 0, 1, ..."""
    end = start + num_new
    return AttentionMetadata(
        slot_mapping=torch.arange(start, end),  # block b, offset o -> slot b * BLOCK_SIZE + o
        query_start_loc=torch.tensor([0, num_new]),
        seq_lens=torch.tensor([end]),
        block_tables=torch.arange(NUM_BLOCKS)[None, :],
        query_lens=[num_new], seq_lens_list=[end], block_size=BLOCK_SIZE,
    )


def run_ours(model: Transformer, token_ids: list[int], cache: KVCache, start: int,
             last_only: bool = False) -> torch.Tensor:
    """Feed token_ids at positions start...; logits (T, vocab) of the new positions, or
    (1, vocab) of the last one."""
    ids = torch.tensor(token_ids)
    positions = torch.arange(start, start + len(token_ids))
    hidden = model(ids, positions, cache, single_sequence_meta(start, len(token_ids)))
    return model.compute_logits(hidden[-1:] if last_only else hidden)


def new_cache(model: Transformer) -> KVCache:
    return KVCache(model.config, NUM_BLOCKS, BLOCK_SIZE, dtype=torch.float32)


@torch.no_grad()
def test_every_tensor_equals_transformers_dequantization(real: RealModel) -> None:
    reference = real.reference.state_dict()
    for name, tensor in real.checkpoint.tensors.items():
        assert tensor.shape == reference[name].shape, name
        assert (tensor - reference[name]).abs().max().item() <= 1e-6, name
    assert set(reference) - set(real.checkpoint.tensors) <= {"lm_head.weight"}
    if real.checkpoint.config.tie_word_embeddings:
        assert torch.equal(reference["lm_head.weight"], real.checkpoint.tensors["model.embed_tokens.weight"])


@torch.no_grad()
@pytest.mark.parametrize("prompt", PROMPTS, ids=["short", "code", "story"])
def test_prefill_logits_match_transformers(real: RealModel, prompt: str) -> None:
    token_ids = real.tokenizer.encode(prompt)
    ours = run_ours(real.ours, token_ids, new_cache(real.ours), start=0)
    reference = real.reference(torch.tensor([token_ids])).logits[0].float()
    assert ours.shape == reference.shape == (len(token_ids), real.checkpoint.config.vocab_size)
    assert reference.abs().max() > 5  # a real logit scale, so 1e-3 is a tight bound
    assert (ours - reference).abs().max().item() <= 1e-3


@torch.no_grad()
def test_greedy_continuation_matches_transformers(real: RealModel) -> None:
    prompt = real.tokenizer.encode_chat(QUESTION)

    cache = new_cache(real.ours)
    ours = [int(run_ours(real.ours, prompt, cache, start=0, last_only=True)[-1].argmax())]
    while len(ours) < NUM_GREEDY_TOKENS:
        position = len(prompt) + len(ours) - 1
        ours.append(int(run_ours(real.ours, [ours[-1]], cache, start=position)[-1].argmax()))

    out = real.reference(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
    reference = [int(out.logits[0, -1].argmax())]
    while len(reference) < NUM_GREEDY_TOKENS:
        out = real.reference(torch.tensor([[reference[-1]]]), cache=out.cache, use_cache=True)
        reference.append(int(out.logits[0, -1].argmax()))

    assert ours == reference, real.tokenizer.decode(ours) + "\n---\n" + real.tokenizer.decode(reference)
    assert len(set(ours)) > 8  # a real answer, not one token repeated
