"""Speculator: after each step, which running sequences draft, how many tokens, and by
which drafter. Imports no torch (a draft model's drafter does, on its own).

A sequence drafts when it is decoding (exactly one token left to compute), has at least
two tokens left before ``max_tokens`` (a run of k drafts emits up to k + 1 tokens, so k
is cut to the tokens left minus one: ``max_tokens`` is never exceeded and no draft is
wasted), and its acceptance record does not pause it; how many it drafts is the k that
maximizes its expected tokens per second (engine/spec/acceptance.py), priced by the step
times the engine measures (``StepCosts``: ``record_step`` after each step, and the
drafter's own time per drafted token around each proposal). Sequences are priced in
turn, each against the step's rows so far (batch 1: exactly the step it will run). When
the step without drafts has not been measured lately, one step decodes plainly to
measure it (step_costs.py).

Structured output speculates too: a grammar row's drafts are cut before the first token
its grammar refuses (and after one that completes it: EOS follows), so every drafted position
has a matcher (``GrammarMatcher.along``, a fork per position, built by the runner) whose
mask the verifier applies to that position's logits. The request's own matcher advances
only through the tokens the verifier emits (``Request.append_output``), so a rejected
tail never reaches it: nothing has to be rolled back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from inferpath.engine.request import Request, RequestStatus
from inferpath.engine.spec.acceptance import AcceptanceTracker, expected_tokens
from inferpath.engine.spec.step_costs import StepCosts
from inferpath.speculative_config import SpeculativeConfig


class Speculator:
    """Holds the drafter (``propose(requests, num_drafts)`` and ``release(live_seq_ids)``),
    the per-sequence acceptance records and the measured step costs (``costs``)."""

    def __init__(self, config: SpeculativeConfig, proposer, costs: StepCosts | None = None):
        self.config = config
        self.proposer = proposer
        self.costs = costs if costs is not None else StepCosts()

    def record_step(self, scheduled, seconds: float) -> None:
        """The engine's step of ``scheduled`` (a SchedulerOutput) took ``seconds``: priced
        when every chunk is a decode or a verification (step_costs.py)."""
        chunks = scheduled.chunks
        if chunks and all(c.samples and c.num_new_tokens == 1 + len(c.draft_token_ids) for c in chunks):
            self.costs.record(scheduled.num_batched_tokens, seconds)

    def propose(self, running: Sequence[Request], waiting: Sequence[Request] = ()) -> None:
        """Draft for every running sequence that should (see the module docstring); a
        paused one gets a shadow proposal where proposals are free (engine/spec/acceptance.py)."""
        observe = getattr(self.proposer, "observe", None)  # suffix.py: every running output so far,
        if observe is not None:                             # this step's tokens included, before any lookup
            observe(running)
        chosen, num_drafts, shadowed = [], [], []
        decoding = [r for r in running if r.status is RequestStatus.RUNNING
                    and r.num_tokens - r.num_computed_tokens == 1]
        rows, tokens = len(decoding), float(len(decoding))  # the step's rows and expected tokens so far
        measure_plain = self.costs.needs_sample(rows)
        for request in running:
            k = self._num_drafts(request)
            if k <= 0:
                continue
            tracker = request.spec_acceptance
            if tracker.should_draft(request.all_token_ids):
                if measure_plain:
                    continue
                k = tracker.num_drafts(k, self.costs, rows, tokens)
                if k > 0:
                    chosen.append(request)
                    num_drafts.append(k)
                    rows += k
                    tokens += expected_tokens(tracker.rate, k) - 1.0
            elif getattr(self.proposer, "proposals_are_free", False):
                shadowed.append(request)
        if chosen:
            start = time.perf_counter()
            self.proposer.propose(chosen, num_drafts)
            seconds = time.perf_counter() - start
            # a drafter that times its own passes (draft_model.py) says which are drafting
            timing = getattr(self.proposer, "last_timing", (max(len(r.spec_token_ids) for r in chosen), seconds))
            if timing is not None and timing[0] > 0:
                self.costs.record_draft(*timing)
            for request in chosen:
                if request.grammar is not None and request.spec_token_ids:
                    _cut_to_grammar(request)
        if shadowed:
            self.proposer.propose(shadowed, [1] * len(shadowed))
            for request in shadowed:
                request.spec_acceptance.shadow(request.num_tokens, request.spec_token_ids)
                request.spec_token_ids, request.spec_draft_probs = [], None
        self.proposer.release({r.seq_id for r in running} | {r.seq_id for r in waiting})

    def _num_drafts(self, request: Request) -> int:
        if (request.status is not RequestStatus.RUNNING
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
        return k


def _cut_to_grammar(request: Request) -> None:
    """Cut ``request``'s drafts (and their distributions) before the first token its
    grammar refuses, or after the one that completes it."""
    drafts = request.spec_token_ids
    n = request.grammar.valid_prefix(drafts)
    if n < len(drafts):
        request.spec_token_ids = drafts[:n]
        if request.spec_draft_probs is not None:
            request.spec_draft_probs = request.spec_draft_probs[:n] if n else None


def build_speculator(config: SpeculativeConfig, *, target_config=None, draft=None,
                     engine_config=None) -> Speculator:
    """The speculator of ``config``. ``draft_model``: ``draft`` is a built draft model
    (torch.nn.Module with its ModelConfig as ``draft.config``), or None to load
    ``config.model`` here."""
    if config.method == "ngram":
        from inferpath.engine.spec.ngram import NgramProposer

        return Speculator(config, NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max))
    if config.method == "suffix":
        from inferpath.engine.spec.suffix import SuffixProposer

        return Speculator(config, SuffixProposer.from_config(config))
    from inferpath.engine.spec.draft_model import DraftModelProposer

    return Speculator(config, DraftModelProposer.build(config, target_config, draft, engine_config))
