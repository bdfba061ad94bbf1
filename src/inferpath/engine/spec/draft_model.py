"""Draft-model drafts: a smaller model with the target's vocabulary proposes k tokens.

The draft model has its own paged KV cache and block manager, kept in step with the
target lazily: for each sequence it remembers how many of the sequence's tokens have
valid K/V in the draft cache (``_num_computed``). A proposal for sequences S, k tokens
each, is k batched forward passes of the draft model over all of S:

    pass 0:      every sequence's tokens the draft has not computed yet (after the
                 previous verification: the accepted drafts it had not fed and the
                 target's correction; on first sight: the whole prompt) -> d_1
    pass 1..k-1: d_j of each sequence still drafting -> d_{j+1}

so the draft cache ends holding the sequence and d_1..d_{k-1}. ``last_timing`` keeps the
passes' count and seconds for the speculator's price of a drafted token (step_costs.py),
leaving out a pass 0 that caught up on more than k + 1 tokens of a sequence (its prompt
on first sight, or after a pause): that is a prefill, not the cost of a draft. After the target verifies,
the draft's K/V stays valid through the drafts that were accepted (same tokens at the
same positions), so the next pass 0 starts there. A sequence the draft cache cannot
hold just gets no drafts this step (never a preemption).

With ``draft_vocab_size`` (speculative_config.py) the draft's LM head computes the logits of
the token ids below it and of the rows' end-of-sequence ids only, the rest -inf: a draft
step reads that share of the head (the packaged Qwen2.5-Coder-0.5B's Q8_0 head is 136 of
the 393 MB it reads a token). Rows under a grammar take the whole head (their grammar may
allow none of the prefix).

Rows the target samples greedily take the draft's argmax (a point mass: no
distributions kept); sampled rows draw from the draft's own distribution under the
same parameters (``Sampler.probabilities``), which is kept as ``spec_draft_probs`` for
the rejection rule (sampling/rejection.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from inferpath.cache.blocks import BlockManager
from inferpath.cache.kv import KVCache
from inferpath.config import ConfigError
from inferpath.engine.request import Request
from inferpath.model.metadata import AttentionMetadata
from inferpath.model.transformer import head_rows_supported
from inferpath.sampling.sampler import Sampler, SamplingRow, draw_from_probs
from inferpath.threads import sampling_threads


class DraftModelProposer:
    """Proposes drafts with ``model`` over its own ``kv_cache``; see the module docstring."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, sampler: Sampler,
                 vocab_rows: int | None = None):
        self.model = model
        self.vocab_rows = vocab_rows  # the head's rows a draft computes (None: all)
        self.kv_cache = kv_cache
        self.block_manager = BlockManager(kv_cache.num_blocks, kv_cache.block_size,
                                          enable_prefix_caching=False)
        self.sampler = sampler
        self.max_positions = model.config.max_position_embeddings
        self._num_computed: dict[object, int] = {}  # seq_id -> tokens with valid draft K/V
        self._fed: dict[object, tuple[int, list[int]]] = {}  # seq_id -> (position, drafts fed)
        self.last_timing: tuple[int, float] | None = None  # (passes, seconds) of the last proposal

    @classmethod
    def build(cls, config, target_config, draft, engine_config) -> DraftModelProposer:
        """The proposer for ``config.model`` (loaded here unless ``draft`` is given), with
        a KV cache of the target's geometry (``num_kv_blocks``, or the memory budget)."""
        from inferpath.engine import builder

        if draft is None:
            from inferpath.engine.load import build_for_engine, load_weights
            from inferpath.models import resolve_model

            checkpoint, plan = load_weights(resolve_model(config.model), engine_config)
            draft = build_for_engine(checkpoint, plan, engine_config)
        draft_config = draft.config
        if target_config is not None and draft_config.vocab_size != target_config.vocab_size:
            raise ConfigError(
                f"the draft model {config.model!r} has a vocabulary of {draft_config.vocab_size} "
                f"tokens but the target has {target_config.vocab_size}: a draft model must share "
                "the target's tokenizer; choose one of the same family")
        vocab_rows = config.draft_vocab_size
        if vocab_rows is not None:
            if vocab_rows > draft_config.vocab_size:
                raise ConfigError(
                    f"speculative_config draft_vocab_size {vocab_rows} is above the draft model's "
                    f"vocabulary of {draft_config.vocab_size} tokens")
            if not head_rows_supported(draft.lm_head):
                raise ConfigError(
                    f"speculative_config draft_vocab_size: the draft model's LM head "
                    f"({type(draft.lm_head).__name__}) cannot compute part of the vocabulary")
            vocab_rows = None if vocab_rows == draft_config.vocab_size else vocab_rows
        kv_cache = builder.build_kv_cache(draft_config, engine_config, draft.dtype)
        return cls(draft, kv_cache, Sampler(engine_config.seed), vocab_rows)

    # ------------------------------------------------------------------ proposing
    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> None:
        active = []  # (request, k, fed tokens for pass 0)
        for request, k in zip(requests, num_drafts):
            request.spec_token_ids, request.spec_draft_probs = [], None
            if request.num_tokens + k - 1 > self.max_positions:  # past the draft's context
                continue
            start = self._sync(request)
            if self._reserve(request.seq_id, request.num_tokens + k - 1):
                active.append((request, k, request.all_token_ids[start:]))
        drafts: dict[object, list[int]] = {r.seq_id: [] for r, _, _ in active}
        probs: dict[object, list[torch.Tensor]] = {r.seq_id: [] for r, _, _ in active}
        # a grammar row drafts under its grammar: a fork advanced through its own drafts
        forks = {r.seq_id: r.grammar.fork() for r, _, _ in active if r.grammar is not None}
        feeds = [(r, fed) for r, _, fed in active]
        catching_up = any(len(fed) > k + 1 for _, k, fed in active)
        num_timed, seconds = 0, 0.0
        for step in range(max((k for _, k, _ in active), default=0)):
            start = time.perf_counter()
            hidden = self._forward([(r.seq_id, fed) for r, fed in feeds])
            logits = self._logits(hidden, [r for r, _ in feeds])  # (num_feeds, vocab)
            tokens = self._choose(logits, [r for r, _ in feeds], drafts, probs, forks)
            if step > 0 or not catching_up:
                num_timed, seconds = num_timed + 1, seconds + time.perf_counter() - start
            next_feeds = []
            for (request, _), token in zip(feeds, tokens):
                drafts[request.seq_id].append(token)
                k = next(k for r, k, _ in active if r is request)
                fork = forks.get(request.seq_id)
                if fork is not None and (not fork.accept(token) or fork.is_terminated):
                    continue  # refused or complete: the speculator cuts the drafts here
                if step + 1 < k:
                    next_feeds.append((request, [token]))
            feeds = next_feeds
            if not feeds:
                break
        self.last_timing = (num_timed, seconds) if num_timed else None
        for request, _, _ in active:
            request.spec_token_ids = drafts[request.seq_id]
            if probs[request.seq_id]:
                request.spec_draft_probs = torch.stack(probs[request.seq_id])  # (k, vocab)
            # fed to the draft: the real tokens, then every draft but the last from position
            # num_tokens (d_1..d_{k-1} when all k were drafted)
            self._fed[request.seq_id] = (request.num_tokens, drafts[request.seq_id][:-1])

    def _sync(self, request: Request) -> int:
        """How many of the request's tokens have valid draft K/V now; the draft feeds the
        rest. Drafts fed last time stay valid while they match the tokens accepted."""
        seq_id = request.seq_id
        num_computed = self._num_computed.get(seq_id, 0)
        fed = self._fed.pop(seq_id, None)
        tokens = request.all_token_ids
        if fed is not None:
            position, fed_drafts = fed
            num_computed = position
            for j, token in enumerate(fed_drafts):
                if position + j >= len(tokens) or tokens[position + j] != token:
                    break
                num_computed = position + j + 1
        num_computed = min(num_computed, len(tokens) - 1)  # the last token is always fed
        self._num_computed[seq_id] = num_computed
        return num_computed

    def _reserve(self, seq_id: object, num_slots: int) -> bool:
        bm = self.block_manager
        if not bm.has_blocks(seq_id):
            if not bm.can_allocate(num_slots):
                return False
            bm.allocate(seq_id, num_slots)
            return True
        if not bm.can_append_slots(seq_id, num_slots):
            return False
        bm.append_slots(seq_id, num_slots)
        return True

    def _choose(self, logits: torch.Tensor, requests: list[Request], drafts: dict,
                probs: dict, forks: dict) -> list[int]:
        """One draft token per row: the argmax for greedy rows, a draw from the draft's
        distribution (kept in ``probs``) for sampled ones; under the row's grammar (its
        fork in ``forks``) where it has one."""
        rows = [SamplingRow(r.params, r.prompt_token_ids, r.output_token_ids + drafts[r.seq_id],
                            r.generator, r.eos_token_ids, forks.get(r.seq_id)) for r in requests]
        greedy = [i for i, r in enumerate(requests) if r.params.is_greedy]
        sampled = [i for i, r in enumerate(requests) if not r.params.is_greedy]
        tokens = [0] * len(requests)
        with sampling_threads(logits.numel()):  # few logits: on this thread (threads.py)
            if greedy:
                out = self.sampler(logits[greedy], [rows[i] for i in greedy])
                for i, token in zip(greedy, out.token_ids):
                    tokens[i] = token
            if sampled:
                q, _ = self.sampler.probabilities(logits[sampled], [rows[i] for i in sampled])
                for j, i in enumerate(sampled):
                    generator = requests[i].generator or self.sampler.shared_generator
                    u = torch.rand(1, 1, dtype=torch.float64, generator=generator)
                    tokens[i] = int(draw_from_probs(q[j:j + 1], u)[0])
                    probs[requests[i].seq_id].append(q[j])
        return tokens

    def _logits(self, hidden: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """(rows, vocab) float32 logits of the rows' last hidden states: the whole head, or
        with ``vocab_rows`` the ids below it and the rows' end-of-sequence ids (the rest -inf)."""
        n, vocab = self.vocab_rows, self.model.config.vocab_size
        if n is None or any(r.grammar is not None for r in requests):
            return self.model.compute_logits(hidden)
        logits = torch.full((hidden.shape[0], vocab), float("-inf"), dtype=torch.float32)
        logits[:, :n] = self.model.compute_logits(hidden, vocab=(0, n))
        for token in sorted({t for r in requests for t in r.eos_token_ids if n <= t < vocab}):
            logits[:, token] = self.model.compute_logits(hidden, vocab=(token, token + 1))[:, 0]
        return logits

    def _forward(self, feeds: list[tuple[object, list[int]]]) -> torch.Tensor:
        """Run the draft model over each sequence's fed tokens (from its num_computed on);
        returns each one's last hidden state: (len(feeds), hidden_size)."""
        bs = self.block_manager.block_size
        input_ids, positions, slots, query_lens, seq_lens, tables, last = [], [], [], [], [], [], []
        for seq_id, fed in feeds:
            start = self._num_computed[seq_id]
            end = start + len(fed)
            table = self.block_manager.block_table(seq_id)
            input_ids += fed
            positions += range(start, end)
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_lens.append(len(fed))
            seq_lens.append(end)
            tables.append(table)
            last.append(len(input_ids) - 1)
            self._num_computed[seq_id] = end
        max_blocks = -(-max(seq_lens) // bs)
        padded = [t[:max_blocks] + [0] * (max_blocks - len(t[:max_blocks])) for t in tables]
        query_start_loc = [0]
        for n in query_lens:
            query_start_loc.append(query_start_loc[-1] + n)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.long),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long),
            block_tables=torch.tensor(padded, dtype=torch.long),
            query_lens=query_lens, seq_lens_list=seq_lens, block_size=bs)
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long),
                            torch.tensor(positions, dtype=torch.long), self.kv_cache, meta)
        return hidden.index_select(0, torch.tensor(last))

    def release(self, live_seq_ids: set) -> None:
        """Free the draft blocks of sequences no longer running or waiting."""
        for seq_id in [s for s in self._num_computed if s not in live_seq_ids]:
            del self._num_computed[seq_id]
            self._fed.pop(seq_id, None)
            if self.block_manager.has_blocks(seq_id):
                self.block_manager.free(seq_id)
