"""The trace's top candidates of a step's logits equal softmax-then-topk (the second path)."""

from __future__ import annotations

import pytest
import torch

from inferpath.engine.trace import CANDIDATE_CHUNK, top_candidates


@pytest.mark.parametrize("rows, vocab", [(1, 49_152), (8, 49_152), (3, 151_936), (2, 64), (4, 10 * CANDIDATE_CHUNK + 7),
                                         (2, 2 * 5 * CANDIDATE_CHUNK - 1)])
def test_top_candidates_equal_softmax_then_topk(rows, vocab):
    generator = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=generator) * 4  # (rows, vocab)
    # the best logits clustered in one chunk, and one in the tail past the whole chunks
    logits[0, 5:9] += 40
    logits[-1, -1] += 50
    probs, ids = top_candidates(logits, 5)
    ref_probs, ref_ids = logits.softmax(dim=-1).topk(5, dim=-1)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-6, atol=1e-9)


def test_bf16_logits_are_read_as_float32():
    logits = torch.randn(2, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    probs, ids = top_candidates(logits, 5)
    ref_probs, _ = logits.float().softmax(dim=-1).topk(5, dim=-1)
    assert probs.dtype == torch.float32
    # rounded logits tie: the same probabilities, each at an id that has it (ties may order apart)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-6, atol=1e-9)
    assert torch.equal(logits.float().softmax(dim=-1).gather(1, ids), probs)
    assert all(len(set(row)) == 5 for row in ids.tolist())
