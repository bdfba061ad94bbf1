"""Per-request batch invariance: a step's chunks split into passes, each one forward.

With ``EngineConfig(deterministic_seeded=True)`` the requests that set a seed
(``Request.row_invariant``) must give the same token ids and logprobs alone, in any batch,
with chunked prefill and after preemption, while the others keep the fast kernels. A
row's bits depend on the kernel that computes it, and the default kernels choose by the
step's shape (GEMM blocking by row count, prompt rows' attention beside decodes'). So the
runner computes the step as at most two sub-batches:

    pass 0  the chunks of ordinary requests   default dispatch (GEMM, AMX, wide quant tiles)
    pass 1  the chunks of row-invariant ones  inside ``row_invariant_dispatch``: each row
                                              through a kernel whose result depends on the
                                              row alone (model/batch_invariant.py)

Both passes write K/V into the one cache (disjoint slots) and their logits rejoin for
one sampler call, whose outputs go back to the step's chunk order (``PassJoin``). A step
with only one kind of request is one pass, as before. The price is paid where both kinds
share a step: the weights are read twice.

NOTE: a pass-1 row equals the same row computed alone, whatever else pass 1 holds: that is
the batch-invariant mode's property (tests/test_batch_invariant.py), so seeded requests
may share their pass. Their K/V blocks are cached in a prefix-cache namespace of their
own (cache/blocks.py ``root_hash``): a block computed by pass 0 is never read as if
pass 1 had computed it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferpath.engine.outputs import RunnerOutput
from inferpath.engine.scheduler import ScheduledChunk


@dataclass(frozen=True)
class RowPass:
    """One forward of a step: its chunks (in step order) and whether it runs inside
    ``row_invariant_dispatch``."""

    chunks: list[ScheduledChunk]
    invariant: bool

    @property
    def seq_ids(self) -> list:
        return [c.request.seq_id for c in self.chunks]


def split_passes(chunks: list[ScheduledChunk], model_invariant: bool) -> list[RowPass]:
    """The step's passes: one when every chunk runs the same way (a batch-invariant model
    runs all of them invariant), else ordinary chunks first, then row-invariant ones."""
    invariant = [c for c in chunks if c.request.row_invariant]
    if model_invariant or not invariant or len(invariant) == len(chunks):
        return [RowPass(chunks, model_invariant or bool(invariant))]
    return [RowPass([c for c in chunks if not c.request.row_invariant], False), RowPass(invariant, True)]


class PassJoin:
    """Joins the passes' sampling inputs into one batch and puts the sampler's outputs
    back into step order.

    Each pass's sampling rows are in its chunks' order; the joined batch is pass after
    pass. ``order[i]`` is where the step's i-th sampling chunk sits in the joined batch.
    """

    def __init__(self, step_chunks: list[ScheduledChunk], passes: list[RowPass]) -> None:
        joined = [c for p in passes for c in p.chunks if c.samples]
        place = {id(c): j for j, c in enumerate(joined)}
        self.order = [place[id(c)] for c in step_chunks if c.samples]

    @staticmethod
    def rows(parts: list) -> list:
        """The joined sampling rows. ``parts``: each pass's ``BatchInputs``, none with
        drafts (EngineConfig refuses speculative decoding with ``deterministic_seeded``)."""
        if any(b.drafts is not None for b in parts):
            raise RuntimeError("a step of two row passes holds speculative drafts: "
                               "deterministic_seeded does not support speculative decoding")
        return [r for b in parts for r in b.sampling_rows]

    @staticmethod
    def logits(parts: list[torch.Tensor | None]) -> torch.Tensor:
        """Each pass's (rows, vocab) logits (None: no sampling row) -> the joined ones."""
        return torch.cat([logits for logits in parts if logits is not None])

    def to_step_order(self, output: RunnerOutput) -> RunnerOutput:
        """The sampler's output for the joined batch, in the step's chunk order."""
        def pick(values: list) -> list:
            return [values[j] for j in self.order] if values else values

        return RunnerOutput(pick(output.token_ids), pick(output.logprobs), pick(output.errors))

