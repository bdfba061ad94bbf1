"""Stage 6: the batched sampler, from the LM head's logits to one token per row.

Order (design.md): min-tokens ban -> penalties -> temperature -> top-k -> top-p
-> min-p -> seeded draw (argmax for greedy rows) -> logprobs of the raw logits.

Each step does only the work some row needs: no penalty pass when no row has a
penalty, no softmax or noise when every row is greedy, no sort when no row uses top-k
or top-p, no log-softmax when no row asks for logprobs.

The draw: for probabilities p and independent noise E_i ~ Exponential(1), the index of
max(p_i / E_i) is distributed exactly as p (it is the first arrival among independent
exponential clocks of rates p_i; the Gumbel-max trick in another form). A row with its
own ``generator`` draws its V noise values from it, so its token depends only on its
logits and its generator's state, not on the batch around it. Rows without one share
the sampler's generator.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from inferpath.sampling.logprobs import TokenLogprobs, compute_logprobs
from inferpath.sampling.params import SamplingParams
from inferpath.sampling.penalties import apply_penalties
from inferpath.sampling.truncation import apply_min_p, apply_top_k_top_p

# Smallest noise value used: keeps p / E finite (E = 0 has probability ~2^-24 per draw).
_MIN_NOISE = 1e-10


@dataclass(slots=True)
class SamplingRow:
    """What the sampler needs to know about one sequence this step.

    - ``prompt_token_ids`` / ``output_token_ids``: the tokens seen so far (penalties;
      ``len(output_token_ids)`` is compared with ``params.min_tokens``).
    - ``generator``: the request's own generator (seeded by the engine with
      ``params.seed``), on the logits' device; None = the sampler's shared one.
    - ``eos_token_ids``: the model's EOS ids; with ``params.stop_token_ids`` they are
      banned (logit -inf) while fewer than ``params.min_tokens`` tokens have been
      generated (EOS ids only unless ``params.ignore_eos``). Default: none.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    eos_token_ids: Collection[int] = ()


@dataclass(slots=True)
class SamplerOutput:
    """One token per row, and its logprobs for rows whose params ask (else None)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    """Turns (num_rows, vocab) logits into one token per row; see the module docstring.

    ``seed`` seeds the generator shared by rows without their own (None = random).
    The caller's logits tensor is never modified.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._shared_generators: dict[torch.device, torch.Generator] = {}

    def shared_generator(self, device: torch.device) -> torch.Generator:
        """The generator for rows without their own, one per device, created lazily."""
        generator = self._shared_generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._shared_generators[device] = generator
        return generator

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must have shape (num_rows={len(rows)}, vocab_size), got {tuple(logits.shape)}"
            )
        raw_logits = logits
        logits = _ban_before_min_tokens(logits.float(), rows)
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

        sampled = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if len(sampled) == len(rows):
            token_ids = self._draw(logits, rows)
        else:
            token_ids = logits.argmax(dim=-1)  # (num_rows,)
            if sampled:
                token_ids[sampled] = self._draw(logits[sampled], [rows[i] for i in sampled])

        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        logprobs: list[TokenLogprobs | None] = [None] * len(rows)
        if wanted:
            computed = compute_logprobs(
                raw_logits[wanted], token_ids[wanted], [rows[i].params.logprobs for i in wanted]
            )
            for i, row_logprobs in zip(wanted, computed):
                logprobs[i] = row_logprobs
        return SamplerOutput(token_ids=token_ids.tolist(), logprobs=logprobs)

    def _draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Temperature, truncation and the draw for non-greedy rows: (num_rows,) ids."""
        params = [row.params for row in rows]
        temperatures = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temperatures.unsqueeze(1)  # (num_rows, vocab)
        top_k = [p.top_k for p in params] if any(p.top_k > 0 for p in params) else None
        top_p = [p.top_p for p in params] if any(p.top_p < 1.0 for p in params) else None
        if top_k is not None or top_p is not None:
            logits = apply_top_k_top_p(logits, top_k, top_p)
        if any(p.min_p > 0.0 for p in params):
            logits = apply_min_p(logits, [p.min_p for p in params])
        probs = logits.softmax(dim=-1)  # (num_rows, vocab)
        noise = torch.empty_like(probs)
        own = [i for i, row in enumerate(rows) if row.generator is not None]
        shared = self.shared_generator(logits.device)
        if not own:
            noise.exponential_(generator=shared)
        else:
            for i in own:
                noise[i].exponential_(generator=rows[i].generator)
            others = [i for i, row in enumerate(rows) if row.generator is None]
            if others:
                noise[others] = torch.empty_like(noise[others]).exponential_(generator=shared)
        return (probs / noise.clamp_(min=_MIN_NOISE)).argmax(dim=-1)


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
