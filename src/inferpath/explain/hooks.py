"""Time the model's stage modules with forward hooks, attached only while tracing.

The model file has no timing code (design.md: the model stays plain). ``StageTimer`` is a
context manager that registers a pre-hook and a post-hook on every stage-named submodule
and removes them all on exit, so a model that is not being traced runs no hook at all.

Measured rows (summed over layers), and the cost-model stages each one is compared with:

    embedding        embed_tokens                      embedding
    rmsnorm_attn     layers[i].input_layernorm         rmsnorm_attn
    q_proj, k_proj, v_proj, rope (rotary_emb), kv_write, attention (attn), o_proj
                     layers[i].self_attn.*             same names; attention = attn_scores
                                                       + softmax + attn_weighted_sum
    rmsnorm_ffn      layers[i].post_attention_layernorm
    gate_proj, up_proj, silu_mul (act_fn), down_proj   layers[i].mlp.*
    moe_ffn          layers[i].block_sparse_moe        router + gate/up/silu_mul/down
    residual         the rest of each layer's time     residual_attn + residual_ffn
                     (the two adds, views, hook calls)
    final_norm       norm                              final_norm
    lm_head          lm_head                           lm_head

NOTE: on an accelerator the hooks synchronize the device, so each row is the stage's own
time; on the CPU operations are synchronous already.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch import nn

# submodule attribute path inside a DecoderLayer -> measured row
LAYER_STAGES = {
    "input_layernorm": "rmsnorm_attn",
    "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
    "self_attn.rotary_emb": "rope", "self_attn.kv_write": "kv_write", "self_attn.attn": "attention",
    "self_attn.o_proj": "o_proj",
    "post_attention_layernorm": "rmsnorm_ffn",
    "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj", "mlp.act_fn": "silu_mul",
    "mlp.down_proj": "down_proj",
    "block_sparse_moe": "moe_ffn",
}
TOP_STAGES = {"model.embed_tokens": "embedding", "model.norm": "final_norm", "lm_head": "lm_head"}
# measured row -> the cost-model stages it covers
PREDICTED_BY = {
    "attention": ("attn_scores", "softmax", "attn_weighted_sum"),
    "residual": ("residual_attn", "residual_ffn"),
    "moe_ffn": ("router", "gate_proj", "up_proj", "silu_mul", "down_proj"),
}
_LAYER_TOTAL = "_layer_total"


class StageTimer:
    """Accumulates seconds per measured row while inside ``with StageTimer(model)``.

    Invariant: outside the ``with`` block the model carries none of this timer's hooks.
    ``take()`` returns the rows since the last ``take()`` and resets them; ``residual`` is
    derived there as layer time minus the hooked stages inside the layers.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handles: list = []
        self._seconds: dict[str, float] = defaultdict(float)
        self._starts: dict[int, float] = {}
        device = next(model.parameters()).device
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __enter__(self) -> "StageTimer":
        for path, row in TOP_STAGES.items():
            self._attach(self.model.get_submodule(path), row)
        for layer in self.model.model.layers:
            self._attach(layer, _LAYER_TOTAL)
            for path, row in LAYER_STAGES.items():
                try:
                    module = layer.get_submodule(path)
                except AttributeError:
                    continue  # dense layers have no block_sparse_moe, MoE layers no mlp
                self._attach(module, row)
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _attach(self, module: nn.Module, row: str) -> None:
        key = id(module)

        def before(mod, args):
            self._sync()
            self._starts[key] = time.perf_counter()

        def after(mod, args, output):
            self._sync()
            self._seconds[row] += time.perf_counter() - self._starts.pop(key)

        self._handles.append(module.register_forward_pre_hook(before))
        self._handles.append(module.register_forward_hook(after))

    def take(self) -> dict[str, float]:
        """Seconds per measured row since the last call (the layers' remainder as residual)."""
        rows = dict(self._seconds)
        self._seconds.clear()
        layer_total = rows.pop(_LAYER_TOTAL, 0.0)
        inside = sum(v for k, v in rows.items() if k in LAYER_STAGES.values())
        rows["residual"] = max(0.0, layer_total - inside)
        return rows
