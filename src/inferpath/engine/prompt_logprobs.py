"""Prompt logprobs: the logprob of each prompt token given the tokens before it (vLLM's
``prompt_logprobs``; the completions API's ``echo`` with ``logprobs``).

Prompt token i (i >= 1) is scored by the logits of position i - 1, which a prefill chunk
computes anyway and normally throws away; the runner keeps those rows for requests that
ask and runs the LM head on them too, a few hundred rows at a time (a row of logits is
vocab x 4 bytes). Token 0 has no logprob (None), as in vLLM and OpenAI.

Invariant: ``request.prompt_logprobs`` holds entries for prompt tokens 0..k-1 in order;
the runner only asks for tokens >= k, so a preempted and recomputed request is never
scored twice. Such requests skip the prefix cache on admission (the scheduler's
``uses_prefix_cache``): cached positions would not be computed, so could not be scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferpath.sampling.logprobs import compute_logprobs

#: Rows of prompt logits computed at once (memory: rows x vocab x 4 bytes).
MAX_ROWS_PER_PASS = 256


@dataclass
class PromptLogprobsPlan:
    """Which rows of a step's hidden states score which prompt tokens of which request."""

    rows: list[int] = field(default_factory=list)  # indices into the step's hidden states
    targets: list[int] = field(default_factory=list)  # the prompt token each row scores
    num_top: list[int] = field(default_factory=list)
    requests: list[tuple[object, int]] = field(default_factory=list)  # (request, num rows)

    def add_chunk(self, request, start: int, end: int, first_row: int) -> None:
        """A chunk computing positions [start, end) of ``request``, whose hidden states are
        rows ``first_row + (position - start)``."""
        scored = request.prompt_logprobs
        if scored is None:
            return
        first = max(start, len(scored) - 1)  # positions whose next token is not scored yet
        last = min(end, request.num_prompt_tokens - 1)  # exclusive
        if first >= last:
            return
        prompt = request.prompt_token_ids
        self.rows.extend(first_row + (q - start) for q in range(first, last))
        self.targets.extend(prompt[q + 1] for q in range(first, last))
        self.num_top.extend([request.params.prompt_logprobs] * (last - first))
        self.requests.append((request, last - first))

    def score(self, model: torch.nn.Module, hidden: torch.Tensor) -> None:
        """Compute the planned logprobs and append them to each request's list."""
        if not self.rows:
            return
        entries = []
        for begin in range(0, len(self.rows), MAX_ROWS_PER_PASS):
            rows = torch.tensor(self.rows[begin:begin + MAX_ROWS_PER_PASS], device=hidden.device)
            logits = model.compute_logits(hidden.index_select(0, rows))  # (rows, vocab)
            targets = torch.tensor(self.targets[begin:begin + MAX_ROWS_PER_PASS], device=hidden.device)
            entries += compute_logprobs(logits, targets, self.num_top[begin:begin + MAX_ROWS_PER_PASS])
        offset = 0
        for request, count in self.requests:
            request.prompt_logprobs.extend(entries[offset:offset + count])
            offset += count
