"""Stage 6: the batched sampler, from the LM head's logits to one token per row.

Order (design.md): min-tokens ban -> logit_bias -> grammar mask (sampling/constraints.py)
-> penalties -> temperature -> top-k -> top-p -> min-p -> seeded draw (argmax for greedy
rows) -> logprobs of the raw logits.

Each step does only the work some row needs: no penalty pass when no row has a
penalty, no softmax or draw when every row is greedy, no top-k selection when no row
truncates, no log-softmax when no row asks for logprobs.

The draw is by inverse CDF: one uniform u per row, and the token is the first whose
cumulative probability exceeds u (exact for the truncated, renormalised distribution;
one random number per row instead of V noise values, which cost ~40x the cumsum on
CPU). A row with its own ``generator`` draws its u from it, so its token depends only on
its logits and its generator's state, not on the batch around it. Rows without one
share the sampler's generator. A generator is drawn from once per sampled token only:
never for a prompt chunk that does not finish, nor for a prompt recomputed after
preemption (the request keeps its generator), so a seeded stream does not depend on
recompute either. A ``row_invariant`` row's distribution is computed alone.

One row never fails another, and no row ever gets an id outside the vocabulary. Before
each choice (argmax or draw) the logits are checked row by row (``_settle_rows``; where
every row is greedy, by the argmax's own pass, its chosen logit read back): a
row holding +inf keeps only its +inf tokens (equally likely: what the limit of its
distribution is); a row holding NaN, or with every token at -inf, cannot be sampled and
gets an error in ``SamplerOutput.errors`` instead of a token (the engine fails that
request alone). Extreme but valid parameters (a temperature of 1e300, a repetition
penalty of 1e-300) are taken to the nearest float32 that means the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inferpath.sampling.constraints import (
    ConstraintTimer,
    apply_grammars,
    apply_logit_bias,
    keep_closable,
)
from inferpath.sampling.logprobs import TokenLogprobs, compute_logprobs
from inferpath.sampling.params import SamplingParams
from inferpath.sampling.penalties import apply_penalties
from inferpath.sampling.truncation import apply_truncation


@dataclass(slots=True)
class SamplingRow:
    """What the sampler needs to know about one sequence this step.

    - ``prompt_token_ids`` / ``output_token_ids``: the tokens seen so far (penalties;
      ``len(output_token_ids)`` is compared with ``params.min_tokens``).
    - ``generator``: the request's own generator (seeded by the engine with
      ``params.seed``), on any device (a CPU one is fine with CUDA logits: it draws one
      number per step); None = the sampler's shared one.
    - ``eos_token_ids``: the model's EOS ids; with ``params.stop_token_ids`` they are
      banned (logit -inf) while fewer than ``params.min_tokens`` tokens have been
      generated (EOS ids only unless ``params.ignore_eos``). Default: none.
    - ``grammar``: the sequence's ``inferpath.structured.GrammarMatcher`` when its params
      ask for structured output (tokens the grammar forbids get -inf), else None.
    - ``row_invariant``: its distribution is computed as a batch of one (``_draw``), so
      that no neighbour's parameters change its bits (a seeded request under
      ``deterministic_seeded``).
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    eos_token_ids: Collection[int] = ()
    grammar: Any = None
    row_invariant: bool = False


@dataclass(slots=True)
class SamplerOutput:
    """One token per row, and its logprobs for rows whose params ask (else None).

    ``errors[i]`` is None, or why row i could not be sampled (then ``token_ids[i]`` is a
    placeholder 0 and ``logprobs[i]`` None). Every token id is in [0, vocab_size).
    """

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    errors: list[str | None] = field(default_factory=list)

    @property
    def num_errors(self) -> int:
        return sum(e is not None for e in self.errors)


class Sampler:
    """Turns (num_rows, vocab) logits into one token per row; see the module docstring.

    ``seed`` seeds the (CPU) generator shared by rows without their own (None = random).
    ``argmax`` picks greedy rows' tokens, ``(rows, vocab) -> (rows,)`` (the engine passes
    ``inferpath.kernels.argmax_rows``). The caller's logits tensor is never modified.
    """

    def __init__(self, seed: int | None = None,
                 argmax: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.argmax = argmax or (lambda logits: logits.argmax(dim=-1))
        self.shared_generator = torch.Generator()  # CPU: one number per row per step
        if seed is None:
            self.shared_generator.seed()
        else:
            self.shared_generator.manual_seed(seed)
        self.constraint_timer = ConstraintTimer()  # time spent on grammar masks

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must have shape (num_rows={len(rows)}, vocab_size), got {tuple(logits.shape)}"
            )
        raw_logits = logits
        vocab_size = logits.shape[1]
        errors: list[str | None] = [None] * len(rows)
        sampled = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if not sampled:  # every row greedy: the argmax's pass over the logits checks them too
            token_ids = self._settled_argmax(self._constrained(logits, rows, errors, settle=False), errors)
        elif len(sampled) == len(rows):
            token_ids = self._draw(self._constrained(logits, rows, errors), rows, errors, sampled)
        else:
            logits = self._constrained(logits, rows, errors)
            token_ids = self.argmax(logits)  # (num_rows,)
            token_ids[sampled] = self._draw(logits[sampled], [rows[i] for i in sampled], errors, sampled)
        token_ids = keep_closable(token_ids, rows)
        # NOTE: a guard, not a path: no check above lets an id out of the vocabulary.
        outside = ((token_ids < 0) | (token_ids >= vocab_size)).nonzero().flatten().tolist()
        for i in outside:
            errors[i] = errors[i] or f"the sampler chose id {int(token_ids[i])}, outside the vocabulary"
        failed = [i for i, e in enumerate(errors) if e is not None]
        if failed:
            token_ids = token_ids.clone()
            token_ids[failed] = 0

        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None
                  and errors[i] is None]
        logprobs: list[TokenLogprobs | None] = [None] * len(rows)
        if wanted:
            raw = raw_logits[wanted].float()
            unusable = (raw.isnan() | raw.isposinf()).any(dim=-1).tolist()
            for i, bad in zip(wanted, unusable):
                if bad:
                    errors[i] = "the model's logits hold NaN or +inf: no logprobs can be computed"
            wanted = [i for i in wanted if errors[i] is None]
        if wanted:
            computed = compute_logprobs(
                raw_logits[wanted], token_ids[wanted], [rows[i].params.logprobs for i in wanted]
            )
            for i, row_logprobs in zip(wanted, computed):
                logprobs[i] = row_logprobs
        for i, error in enumerate(errors):
            if error is not None:
                errors[i] = f"sampling failed for this request: {error} ({_describe(rows[i].params)})"
                logprobs[i] = None
        return SamplerOutput(token_ids=token_ids.tolist(), logprobs=logprobs, errors=errors)

    def _settled_argmax(self, logits: torch.Tensor, errors: list[str | None]) -> torch.Tensor:
        """The argmax of ``_settle_rows(logits)``'s rows, in one pass over the logits where
        every row is fine: a row's argmax (torch.argmax's: the first NaN if it holds one) has
        a finite or +inf logit unless the row holds NaN or only -inf, and a row holding +inf
        settles to its +inf tokens, the first of which its argmax already is."""
        token_ids = self.argmax(logits)  # (num_rows,)
        if bool((logits.gather(1, token_ids.unsqueeze(1)) > float("-inf")).all()):  # False for NaN too
            return token_ids
        return self.argmax(_settle_rows(logits, errors, "after penalties and min_tokens bans"))

    def _constrained(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
                     errors: list[str | None], settle: bool = True) -> torch.Tensor:
        """min-tokens ban, logit_bias, grammar mask and penalties, then ``_settle_rows``:
        (num_rows, vocab) float32 logits every row of which can be chosen from (``settle``
        False: the caller settles them)."""
        logits = _ban_before_min_tokens(logits.float(), rows)
        logits = apply_logit_bias(logits, rows)
        logits = apply_grammars(logits, rows, self.constraint_timer)
        penalised = [i for i, row in enumerate(rows) if row.params.has_penalties]
        if penalised:
            logits = logits.clone()
            logits[penalised] = apply_penalties(
                logits[penalised],
                [rows[i].prompt_token_ids for i in penalised],
                [rows[i].output_token_ids for i in penalised],
                [rows[i].params.repetition_penalty for i in penalised],
                [rows[i].params.frequency_penalty for i in penalised],
                [rows[i].params.presence_penalty for i in penalised],
            )
        return _settle_rows(logits, errors, "after penalties and min_tokens bans") if settle else logits

    def probabilities(self, logits: torch.Tensor, rows: Sequence[SamplingRow]
                      ) -> tuple[torch.Tensor, list[str | None]]:
        """The distributions the draw of non-greedy ``rows`` samples from: (num_rows, vocab)
        float32 summing to 1 (uniform for a row with an error), and the errors.

        The speculative verifier (sampling/rejection.py) reads them: the same pipeline as
        ``__call__``, stopped before the draw.
        """
        errors: list[str | None] = [None] * len(rows)
        logits = self._constrained(logits, rows, errors)
        probs = self._probs(logits, rows, errors, range(len(rows)))
        return probs, errors

    def _draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow], errors: list[str | None],
              row_index: Sequence[int]) -> torch.Tensor:
        """Temperature, truncation and the draw for non-greedy rows: (num_rows,) ids.

        ``row_index[j]`` is row j's place in ``errors`` (the whole batch's).
        """
        uniforms = self._uniforms(rows, logits.device)  # (num_rows, 1), one per row in row order
        alone = [j for j, row in enumerate(rows) if row.row_invariant]
        if not alone:
            return draw_from_probs(self._probs(logits, rows, errors, row_index), uniforms)
        # NOTE: batched, a row's top-k/top-p candidates are as many as its neighbours need
        # (topk of the largest k, then a logsumexp over them): its bits would follow them
        token_ids = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        batched = [j for j in range(len(rows)) if not rows[j].row_invariant]
        if batched:
            probs = self._probs(logits[batched], [rows[j] for j in batched], errors, [row_index[j] for j in batched])
            token_ids[batched] = draw_from_probs(probs, uniforms[batched])
        for j in alone:
            probs = self._probs(logits[j:j + 1], [rows[j]], errors, [row_index[j]])  # (1, vocab)
            token_ids[j] = draw_from_probs(probs, uniforms[j:j + 1])[0]
        return token_ids

    def _probs(self, logits: torch.Tensor, rows: Sequence[SamplingRow], errors: list[str | None],
               row_index: Sequence[int]) -> torch.Tensor:
        """Temperature and truncation for non-greedy rows, then softmax: (num_rows, vocab)."""
        params = [row.params for row in rows]
        # a temperature above float32's range divides like the largest float32 (uniform)
        temperatures = torch.tensor([min(p.temperature, _FLOAT32_MAX) for p in params],
                                    dtype=logits.dtype, device=logits.device)
        logits = logits / temperatures.unsqueeze(1)  # (num_rows, vocab)
        top_k = [p.top_k for p in params] if any(p.top_k > 0 for p in params) else None
        top_p = [p.top_p for p in params] if any(p.top_p < 1.0 for p in params) else None
        min_p = [p.min_p for p in params] if any(p.min_p > 0.0 for p in params) else None
        row_errors: list[str | None] = [errors[i] for i in row_index]
        logits = _settle_rows(logits, row_errors, "after temperature")
        if top_k is not None or top_p is not None or min_p is not None:
            logits = _settle_rows(apply_truncation(logits, top_k, top_p, min_p), row_errors,
                                  "after top-k/top-p/min-p")
        for j, i in enumerate(row_index):
            errors[i] = row_errors[j]
        return logits.softmax(dim=-1)  # (num_rows, vocab); 0 where masked

    def _uniforms(self, rows: Sequence[SamplingRow], device: torch.device) -> torch.Tensor:
        """One U[0, 1) float64 per row, from the row's generator or the shared one.

        Each number is drawn on its generator's device (CPU generators work with CUDA
        logits) and the (num_rows, 1) result is moved to ``device``.
        """
        shared = self.shared_generator
        if all(row.generator is None for row in rows):
            return torch.rand(len(rows), 1, dtype=torch.float64, generator=shared).to(device)
        generators = [row.generator or shared for row in rows]
        uniforms = [torch.rand(1, dtype=torch.float64, generator=g, device=g.device).to(device) for g in generators]
        return torch.cat(uniforms).unsqueeze(1)  # (num_rows, 1)


def draw_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first token whose cumulative probability exceeds u x total.

    probs: (num_rows, vocab) >= 0, not necessarily summing to 1; uniforms: (num_rows, 1)
    in [0, 1] (1 behaves as u x total rounded up to total would). Token i is drawn with probability probs[i] / total; a token with
    probability 0 never is (the CDF does not rise there). The CDF is summed in float64
    so that even a 1e-9 token keeps its share among 150k others.
    """
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # (num_rows, vocab)
    total = cdf[:, -1:].contiguous()  # (num_rows, 1)
    token_ids = torch.searchsorted(cdf, uniforms * total, right=True)  # (num_rows, 1)
    # NOTE: u x total may round up to total; the last token with probability > 0 then.
    last_nonzero = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(token_ids, last_nonzero).squeeze(1)


def _ban_before_min_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Copy of ``logits`` with EOS / stop ids at -inf for rows short of min_tokens."""
    vocab_size = logits.shape[1]
    row_ids: list[int] = []
    col_ids: list[int] = []
    for i, row in enumerate(rows):
        params = row.params
        if len(row.output_token_ids) >= params.min_tokens:
            continue
        banned = set(params.stop_token_ids)
        if not params.ignore_eos:
            banned.update(row.eos_token_ids)
        banned = [t for t in banned if t < vocab_size]
        row_ids.extend([i] * len(banned))
        col_ids.extend(banned)
    if not row_ids:
        return logits
    index = (torch.tensor(row_ids, device=logits.device), torch.tensor(col_ids, device=logits.device))
    return logits.index_put(index, torch.tensor(float("-inf"), device=logits.device))


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _settle_rows(logits: torch.Tensor, errors: list[str | None], stage: str) -> torch.Tensor:
    """Logits every row of which can be sampled, and an error for each row that cannot.

    logits: (num_rows, vocab) float. A row holding +inf keeps only its +inf tokens, set
    to 0 (the others -inf): the limit of its distribution. A row holding NaN, or only
    -inf, is set to 0 everywhere (any choice is in the vocabulary) and gets an error
    naming ``stage``. Costs one reduction when every row is fine: a row's max is finite
    unless the row holds NaN (amax propagates it), +inf, or only -inf.
    """
    row_max = logits.amax(dim=-1)  # (num_rows,)
    if bool(torch.isfinite(row_max).all()):
        return logits
    has_nan = logits.isnan().any(dim=-1)  # (num_rows,)
    has_pos_inf = logits.isposinf().any(dim=-1)
    all_neg_inf = row_max == float("-inf")
    ninf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    logits = torch.where(has_pos_inf.unsqueeze(1),
                         torch.where(logits.isposinf(), zero, ninf), logits)
    broken = has_nan | (all_neg_inf & ~has_pos_inf)
    for i in broken.nonzero().flatten().tolist():
        if errors[i] is None:
            errors[i] = (f"its logits became NaN {stage}" if has_nan[i]
                         else f"no token is left to choose {stage} (every logit is -inf)")
    return torch.where(broken.unsqueeze(1), zero, logits)


def _describe(params: SamplingParams) -> str:
    """The parameters that shape a row's logits, for an error message."""
    return (f"temperature={params.temperature}, top_p={params.top_p}, top_k={params.top_k}, "
            f"min_p={params.min_p}, repetition_penalty={params.repetition_penalty}, "
            f"frequency_penalty={params.frequency_penalty}, "
            f"presence_penalty={params.presence_penalty}")
