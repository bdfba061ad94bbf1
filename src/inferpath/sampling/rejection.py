"""Speculative verification: accept a prefix of each sequence's drafted tokens, then one
token of the target's own, so that what comes out is distributed exactly as the target's.

A speculative chunk of k drafts has k + 1 logits rows: row j is the target's distribution
p_j of the token after the j-th draft (row 0: after the sequence's last real token). With
drafts d_0..d_{k-1} drawn from q_0..q_{k-1}:

- greedy rows: the tokens are the argmax of each row (the sampler's own choice, so
  penalties, logit_bias and min_tokens act as without drafts). d_j is accepted while
  it equals the argmax of row j; the first argmax that differs is the correction, and if
  all k are accepted the argmax of row k is the bonus token. The text is the greedy text.
- sampled rows (the standard rule of Leviathan et al. and Chen et al., 2023): d_j is
  accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the
  token is drawn from max(0, p_j - q_j) normalised; after k acceptances the bonus token
  is drawn from p_k. For an n-gram draft q_j is a point mass at d_j, so acceptance is
  p_j(d_j) and the residual is p_j with d_j removed. p_j is the distribution the sampler
  would draw from (``Sampler.probabilities``: penalties, temperature, top-k/top-p/min-p).

A grammar row's rows carry the grammar after the drafts before them (``GrammarMatcher.along``),
so each p_j is masked as the plain sampler would mask it there; a sampled grammar row's run
is then passed through the sampler's closing rules token by token (``_steer``), and a token
they change ends the run. Logprobs of emitted tokens are those of the raw logits of their
rows, as without drafts.
A row the sampler cannot use (NaN logits) ends the run before it; at row 0 the chunk
fails as a plain one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inferpath.engine.outputs import RunnerOutput, TokenRun
from inferpath.sampling.logprobs import compute_logprobs
from inferpath.sampling.constraints import keep_closable
from inferpath.sampling.sampler import Sampler, SamplingRow, draw_from_probs


@dataclass(frozen=True, eq=False)  # compared by identity (it holds a tensor)
class DraftRows:
    """One sampling chunk's logits rows: ``first_row`` .. ``first_row + k`` for k drafts
    (k = 0: a plain chunk, one row). ``draft_probs``: (k, vocab) distributions the drafts
    were drawn from, or None for point masses (n-gram or greedy drafts)."""

    first_row: int
    draft_token_ids: tuple[int, ...]
    draft_probs: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.draft_token_ids) + 1


def verify_drafts(sampler: Sampler, logits: torch.Tensor, rows: Sequence[SamplingRow],
                  chunks: Sequence[DraftRows]) -> RunnerOutput:
    """logits: (num_rows, vocab), rows[i] for logits row i; one entry per sampling chunk in
    ``chunks``. Returns a RunnerOutput with a TokenRun for every chunk that had drafts."""
    sampled_spec = [c for c in chunks if c.draft_token_ids and not rows[c.first_row].params.is_greedy]
    direct_rows = [i for c in chunks if c not in sampled_spec
                   for i in range(c.first_row, c.first_row + c.num_rows)]
    chosen: dict[int, tuple[int, object, str | None]] = {}  # row -> (token, logprobs, error)
    if direct_rows:
        out = sampler(logits[direct_rows], [rows[i] for i in direct_rows])
        for j, i in enumerate(direct_rows):
            chosen[i] = (out.token_ids[j], out.logprobs[j], out.errors[j] if out.errors else None)
    runs: dict[int, list[int]] = {}
    if sampled_spec:  # the target's distributions at every row of every sampled chunk, at once
        spec_rows = [i for c in sampled_spec for i in range(c.first_row, c.first_row + c.num_rows)]
        probs, errors = sampler.probabilities(logits[spec_rows], [rows[i] for i in spec_rows])
        offset = 0
        for c in sampled_spec:
            span = slice(offset, offset + c.num_rows)
            runs[c.first_row] = _rejection_run(sampler, logits, rows, c, probs[span], errors[span], chosen)
            offset += c.num_rows

    output = RunnerOutput([], [], [])
    for index, c in enumerate(chunks):
        if c in sampled_spec:
            emitted_rows = runs[c.first_row]
        else:  # greedy: accept while the draft is the argmax
            emitted_rows = [c.first_row]
            for j, draft in enumerate(c.draft_token_ids):
                if chosen[c.first_row + j][0] != draft:
                    break
                emitted_rows.append(c.first_row + j + 1)
        usable = []
        for i in emitted_rows:
            if chosen[i][2] is not None:
                break
            usable.append(i)
        if not usable:
            output.token_ids.append(0)
            output.logprobs.append(None)
            output.errors.append(chosen[c.first_row][2] or "sampling failed for this request")
            continue
        token_ids = [chosen[i][0] for i in usable]
        logprobs = [chosen[i][1] for i in usable]
        output.token_ids.append(token_ids[0])
        output.logprobs.append(logprobs[0])
        output.errors.append(None)
        if c.draft_token_ids:
            output.runs[index] = TokenRun(token_ids, logprobs, len(c.draft_token_ids))
    return output


def _rejection_run(sampler: Sampler, logits: torch.Tensor, rows: Sequence[SamplingRow],
                   chunk: DraftRows, probs: torch.Tensor, errors: list[str | None],
                   chosen: dict) -> list[int]:
    """The rows whose tokens a sampled chunk emits (filling ``chosen`` for them): the
    accepted drafts' rows, then the row of the corrected or bonus token.

    probs: (k + 1, vocab), the target's distributions at the chunk's rows; errors theirs."""
    first, k = chunk.first_row, len(chunk.draft_token_ids)
    errors = list(errors)
    row = rows[first]
    generator = row.generator or sampler.shared_generator
    emitted: list[int] = []
    tokens: list[int] = []
    for j in range(k + 1):
        emitted.append(first + j)
        if errors[j] is not None:
            tokens.append(0)
            break
        p = probs[j]
        if j == k:  # every draft accepted: the bonus token from p_k
            tokens.append(_draw(p, generator))
            break
        draft = chunk.draft_token_ids[j]
        q = None if chunk.draft_probs is None else chunk.draft_probs[j].to(p.device, p.dtype)
        q_draft = 1.0 if q is None else float(q[draft])
        u = float(torch.rand(1, dtype=torch.float64, generator=generator))
        if u * q_draft < float(p[draft]):  # u < p/q: accepted
            tokens.append(draft)
            continue
        if q is None:
            residual = p.clone()
            residual[draft] = 0.0
        else:
            residual = (p - q).clamp_min(0.0)
        if not float(residual.sum()) > 0.0:  # p == q up to rounding: p itself
            residual = p
        tokens.append(_draw(residual, generator))
        break
    _steer(tokens, rows[first:first + len(tokens)], chunk.draft_token_ids, errors)
    del emitted[len(tokens):]

    wants = row.params.logprobs is not None
    lp = [None] * len(emitted)
    if wants:
        raw = logits[emitted].float()
        bad = (raw.isnan() | raw.isposinf()).any(dim=-1).tolist()
        for j, is_bad in enumerate(bad):
            if is_bad and errors[j] is None:
                errors[j] = "the model's logits hold NaN or +inf: no logprobs can be computed"
        good = [j for j in range(len(emitted)) if errors[j] is None]
        if good:
            computed = compute_logprobs(raw[good], torch.tensor([tokens[j] for j in good]),
                                        [row.params.logprobs] * len(good))
            for j, value in zip(good, computed):
                lp[j] = value
    for j, i in enumerate(emitted):
        error = None if errors[j] is None else f"sampling failed for this request: {errors[j]}"
        chosen[i] = (tokens[j], lp[j], error)
    return emitted


def _steer(tokens: list[int], rows: Sequence[SamplingRow], drafts: Sequence[int],
           errors: Sequence[str | None]) -> None:
    """Apply the sampler's closing rules (``keep_closable``) to a grammar row's run, token
    by token: a token steered away from its draft ends the run there (the rows after it
    assumed the draft), as the plain sampler would have steered the same draw."""
    if rows[0].grammar is None:
        return
    for j, row in enumerate(rows):
        if errors[j] is not None:
            return
        steered = int(keep_closable(torch.tensor([tokens[j]]), [row])[0])
        if steered != tokens[j]:
            tokens[j] = steered
            del tokens[j + 1:]
            return
        if j >= len(drafts) or tokens[j] != drafts[j]:
            return


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from (vocab,) non-negative weights, by the sampler's inverse-CDF draw."""
    u = torch.rand(1, 1, dtype=torch.float64, generator=generator).to(probs.device)
    return int(draw_from_probs(probs.unsqueeze(0), u)[0])
