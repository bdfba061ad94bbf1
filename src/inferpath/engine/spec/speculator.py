"""Speculator: after each step, which running sequences draft, how many tokens, and by
which drafter. Imports no torch (a draft model's drafter does, on its own).

A sequence drafts when it is decoding (exactly one token left to compute), is not
constrained by a grammar (structured output is verified token by token by its matcher,
which cannot be rolled back here: such rows simply decode plainly), has at least two
tokens left before ``max_tokens`` (a run of k drafts emits up to k + 1 tokens, so k is
cut to the tokens left minus one: ``max_tokens`` is never exceeded and no draft is
wasted), and its acceptance record (engine/spec/acceptance.py) does not pause it.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferpath.engine.request import Request, RequestStatus
from inferpath.engine.spec.acceptance import AcceptanceTracker
from inferpath.speculative_config import SpeculativeConfig


class Speculator:
    """Holds the drafter (``propose(requests, num_drafts)`` and ``release(live_seq_ids)``)
    and the per-sequence acceptance records."""

    def __init__(self, config: SpeculativeConfig, proposer):
        self.config = config
        self.proposer = proposer

    def propose(self, running: Sequence[Request], waiting: Sequence[Request] = ()) -> None:
        """Draft for every running sequence that should (see the module docstring)."""
        chosen, num_drafts = [], []
        for request in running:
            k = self._num_drafts(request)
            if k > 0:
                chosen.append(request)
                num_drafts.append(k)
        if chosen:
            self.proposer.propose(chosen, num_drafts)
        self.proposer.release({r.seq_id for r in running} | {r.seq_id for r in waiting})

    def _num_drafts(self, request: Request) -> int:
        if (request.status is not RequestStatus.RUNNING or request.grammar is not None
                or request.num_tokens - request.num_computed_tokens != 1):
            return 0
        params = request.params
        num_left = (params.max_tokens - request.num_output_tokens
                    if params.max_tokens is not None else self.config.num_speculative_tokens + 1)
        if request.max_model_len is not None:
            num_left = min(num_left, request.max_model_len - request.num_tokens)
        k = min(self.config.num_speculative_tokens, num_left - 1)
        if k <= 0:
            return 0
        if request.spec_acceptance is None:
            request.spec_acceptance = AcceptanceTracker()
        return k if request.spec_acceptance.should_draft() else 0


def build_speculator(config: SpeculativeConfig, *, target_config=None, draft=None,
                     engine_config=None) -> Speculator:
    """The speculator of ``config``. ``draft_model``: ``draft`` is a built draft model
    (torch.nn.Module with its ModelConfig as ``draft.config``), or None to load
    ``config.model`` here."""
    if config.method == "ngram":
        from inferpath.engine.spec.ngram import NgramProposer

        return Speculator(config, NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max))
    from inferpath.engine.spec.draft_model import DraftModelProposer

    return Speculator(config, DraftModelProposer.build(config, target_config, draft, engine_config))
