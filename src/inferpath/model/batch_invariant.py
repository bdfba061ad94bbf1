"""Batch-invariant mode: a request's logits do not depend on what shares its step.

Floating-point sums round differently in a different order, and the order of most
kernels follows the shape of the whole batch: a matmul blocks its k loop by the row
count, attention padded to the longest sequence and masked sums more (zero) terms, a
prompt row attends in a different kernel than a decode row. So the same request alone, in
a batch of 32, after a prefix-cache hit or after preemption (recomputed as a prompt)
gives logprobs that differ in the last bits, and in bf16 even different tokens.

``make_batch_invariant`` switches a Transformer to an order that depends only on the row
itself:

- linears: each output row is computed the same way for any row count: the native GEMV
  (one FMA chain over k per output, chosen by kernels/ops.py inside
  ``row_invariant_dispatch``, which the runner enters each step) or, without it, one
  ``F.linear`` per row (``RowwiseLinear``);
- attention: every token, prompt or decode, is its own query over exactly keys
  0..position of its sequence (attention.per_token_plan), no padding, no mask;
- RMSNorm, RoPE, the gate, residuals, softmax and log-softmax already work row by row.

The engine turns it on with ``EngineConfig(batch_invariant=True)`` (``--deterministic``).

Per request (``EngineConfig(deterministic_seeded=True)``, ``--deterministic-seeded``): the
runner computes the rows of requests that set a seed as a sub-batch of their own, inside
``row_invariant_dispatch``, and the others as before (engine/row_passes.py). The model is
prepared once by ``make_row_invariant_capable``: its plain linears go row by row only while
the dispatch is on, and attention takes the per-token plan then (model/transformer.py).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


_dispatch = threading.local()


@contextmanager
def _thread_flag(name: str, enabled: bool):
    """``_dispatch.<name>`` set to ``enabled`` within the block (this thread), restored after."""
    previous = getattr(_dispatch, name, False)
    setattr(_dispatch, name, enabled)
    try:
        yield
    finally:
        setattr(_dispatch, name, previous)


def row_invariant_dispatch(enabled: bool = True):
    """Within the block (this thread), the native linears (kernels/ops.py
    ``small_batch_linear``) compute each row the same way whatever the number of rows.
    The runner runs each step of a batch-invariant model inside it."""
    return _thread_flag("row_invariant", enabled)


def rows_must_be_invariant() -> bool:
    """Whether this thread is inside ``row_invariant_dispatch``."""
    return getattr(_dispatch, "row_invariant", False)


def decode_x_passes():
    """Within the block (this thread), the quantized kernels meet x in a decode step's int8
    passes whatever the number of rows (csrc/quant/activations.h: a prompt-sized call's
    K-quants meet it in one pass): the LM head's logits, whose rows are few when serving
    (the sampled positions) and many only for prompt logprobs, at the decode step's
    precision either way."""
    return _thread_flag("decode_passes", True)


QUANT_ROWS_ALONE, QUANT_DECODE_PASSES = 1, 2  # csrc/quant/prepared.h's flags


def quant_call_flags() -> int:
    """The quantized matmul's flags for a call on this thread: QUANT_ROWS_ALONE inside
    ``row_invariant_dispatch``, QUANT_DECODE_PASSES inside ``decode_x_passes``."""
    return (QUANT_ROWS_ALONE if rows_must_be_invariant() else 0) | \
        (QUANT_DECODE_PASSES if getattr(_dispatch, "decode_passes", False) else 0)


def rowwise_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias one row at a time: each row is the same 1-row call whatever the
    batch; x (rows, in) -> (rows, out)."""
    if x.dim() != 2 or x.shape[0] == 1:
        return F.linear(x, weight, bias)
    return torch.cat([F.linear(row, weight, bias) for row in x.split(1)])


class RowwiseLinear(nn.Linear):
    """An ``nn.Linear`` computed one row at a time (the PyTorch batch-invariant path)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rowwise_linear(x, self.weight, self.bias)


class RowwiseWhenAskedLinear(nn.Linear):
    """An ``nn.Linear`` that goes one row at a time inside ``row_invariant_dispatch`` and
    is a plain ``F.linear`` outside it (the per-request batch-invariant sub-batches)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rows_must_be_invariant():
            return rowwise_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def _check_can_be_invariant(model: nn.Module, mode: str) -> None:
    """Raise ValueError naming what stops ``model`` from running batch-invariant rows."""
    if not hasattr(model, "batch_invariant"):
        raise ValueError(f"{mode} needs a single-process Transformer, not a "
                         f"{type(model).__name__} (tensor parallelism is not supported)")
    if getattr(getattr(model, "config", None), "num_linear_layers", 0):
        # a recomputed prompt (after preemption) runs the delta rule's chunked form, the first
        # run its recurrent one: equal to float tolerance, not bit for bit
        raise ValueError(f"{mode} does not support linear-attention layers "
                         f"({model.config.architecture}); run without it")


def make_row_invariant_capable(model: nn.Module) -> nn.Module:
    """Prepare ``model`` (a Transformer, after ``accelerate`` if used) for per-request
    batch-invariant sub-batches, in place; returns it. Plain ``nn.Linear`` modules become
    ``RowwiseWhenAskedLinear`` (unchanged outside ``row_invariant_dispatch``); the native
    ones already choose by ``rows_must_be_invariant``. The model stays fast by default."""
    _check_can_be_invariant(model, "deterministic_seeded (--deterministic-seeded)")
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowwiseWhenAskedLinear
    return model


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Switch ``model`` (a Transformer, after ``accelerate`` if used) to batch-invariant
    execution, in place; returns it. Plain ``nn.Linear`` modules become ``RowwiseLinear``;
    the native ``CPULinear`` ones keep their class and take the GEMV inside the runner's
    ``row_invariant_dispatch``."""
    _check_can_be_invariant(model, "batch-invariant mode")
    model.batch_invariant = True
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowwiseLinear
    return model
