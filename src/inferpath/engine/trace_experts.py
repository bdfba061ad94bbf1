"""Which experts each MoE layer's router chose in a traced step, read off the experts that ran.

Every MoE block of the engine (model/moe.py, deepseek_moe.py, llama4.py) groups a step's
tokens by expert and runs each expert that at least one token routed to, once, on those
tokens' rows; an expert no token chose is never called. So the experts called in a step
are exactly the union of the router's choices over the step's tokens, and the rows each
was called on are the tokens that chose it. The recorder wraps, while attached, each
expert of each MoE layer — an ``experts`` ModuleList's modules (their ``forward``), or a
stacked-experts module's ``expert(e, x)`` (gpt-oss, Llama 4; swapped quantized experts
too) — with a call that notes (layer, expert, rows) and runs the same code.

Invariant: after ``detach()`` no module carries a wrapper of this recorder's (the class's
``forward`` / ``expert`` show again); ``take()`` returns what ran since the last call.
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

# the attribute of a decoder layer that may hold an MoE block, in the order they are tried
_FFN_NAMES = ("block_sparse_moe", "mlp", "feed_forward")


def moe_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer index, MoE block) of every layer whose FFN routes to experts."""
    blocks = []
    for i, layer in enumerate(model.model.layers):
        for name in _FFN_NAMES:
            block = getattr(layer, name, None)
            if block is not None and hasattr(block, "experts"):
                blocks.append((i, block))
                break
    return blocks


class ExpertRecorder:
    """Notes each expert call of each MoE layer while attached (module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self.blocks = moe_blocks(model)
        self._rows: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._wrapped: list[tuple[nn.Module, str]] = []

    def attach(self, marker: str) -> None:
        """Wrap every expert; ``marker`` is set on each wrapper (trace_stages' NATIVE_TIMED)."""
        if self._wrapped:
            return
        for layer, block in self.blocks:
            experts = block.experts
            if isinstance(experts, nn.ModuleList):
                for e, module in enumerate(experts):
                    self._wrap(module, "forward", layer, e, marker)
            elif callable(getattr(experts, "expert", None)):
                self._wrap(experts, "expert", layer, None, marker)
            else:
                raise TypeError(f"layer {layer}: experts of type {type(experts).__name__} are neither a "
                                "ModuleList nor a module with expert(e, x): the trace cannot see their routing")

    def detach(self) -> None:
        for module, name in self._wrapped:
            delattr(module, name)  # the instance attribute: the class's method shows again
        self._wrapped.clear()

    def take(self) -> dict[int, dict[int, int]]:
        """{layer: {expert: rows it ran on}} since the last call (layers that ran experts)."""
        out = {layer: dict(sorted(rows.items())) for layer, rows in sorted(self._rows.items()) if rows}
        self._rows.clear()
        return out

    def _wrap(self, module: nn.Module, name: str, layer: int, expert: int | None, marker: str) -> None:
        inner, rows = getattr(module, name), self._rows

        if expert is None:  # expert(e, x): x (num_routed, hidden)
            def recorded(e, x, *args, **kwargs):
                rows[layer][int(e)] += x.shape[0]
                return inner(e, x, *args, **kwargs)
        else:  # forward(x): x (num_routed, hidden)
            def recorded(x, *args, **kwargs):
                rows[layer][expert] += x.shape[0]
                return inner(x, *args, **kwargs)

        setattr(recorded, marker, True)
        setattr(module, name, recorded)
        self._wrapped.append((module, name))
