"""Which modules of the served model a trace times, and what each measured row covers.

The clock wraps the modules the engine really runs, kernels and fusions included, and
none whose wrapping would change what runs: the fused ``CPUSelfAttention`` and
``CPUSwiGLUMLP`` (kernels/fused.py) never call ``q_proj``/``k_proj``/``v_proj``,
``gate_proj``/``up_proj`` or ``act_fn`` (and step aside to the unfused path if those carry
a forward hook), so those are never timed on their own. Their time is measured as the
parent's time minus its timed children, and the row says which
cost-model stages it covers instead of inventing a split:

    row            timed module (per layer unless noted)      cost-model stages it covers
    embedding      model.embed_tokens (once)                  embedding
    rmsnorm_attn   input_layernorm                            rmsnorm_attn
    qkv_proj       self_attn minus its timed children         q_proj, k_proj, v_proj
    rope           self_attn.rotary_emb                       rope
    kv_write       self_attn.kv_write                         kv_write
    attention      self_attn.attn                             attn_scores, softmax, attn_weighted_sum
    o_proj         self_attn.o_proj                           o_proj
    rmsnorm_ffn    post_attention_layernorm                   rmsnorm_ffn
    gate_up_silu   mlp minus mlp.down_proj                    gate_proj, up_proj, silu_mul
    down_proj      mlp.down_proj                              down_proj
    moe_ffn        block_sparse_moe                           router, gate_proj, up_proj, silu_mul, down_proj
    residual       each layer minus the above                 residual_attn, residual_ffn
    final_norm     model.norm (once)                          final_norm
    lm_head        lm_head (once)                             lm_head
    sampling       the sampler call (timed by the tracer)     sampling
    other          the step minus every row above: laying out the batch, the attention plan

A step that runs the native decode call (kernels/decode_stack.py: decode rows, short
chunks such as speculative verifications) runs no layer module: the call times its own
stages (csrc/drivers/decode.c, a clock read at each stage boundary of each layer, into a
buffer the clock hands the stack while attached) and ``take`` turns its slots into the
same rows: rmsnorm_attn, qkv_proj (the fused Q/K/V matmul), rope, kv_write, attention,
o_proj, residual (both adds), rmsnorm_ffn, gate_up_silu (the fused gate/up matmul and the
SiLU-and-multiply, timed apart inside the call and summed here), down_proj. The layer
wrappers are marked (``NATIVE_TIMED``) so that they do not send a traced step to the module
path: they time the steps that take it. embedding, final_norm and lm_head are timed by their
wrappers on either path.

Invariant: the rows of a step sum to the step's wall time (``other`` is the remainder),
and every row but ``other`` is time spent inside the module or native stage it names.
"""

from __future__ import annotations

import time
from collections import defaultdict

from torch import nn

from inferpath.engine.trace_experts import ExpertRecorder
from inferpath.kernels.decode_stack import NATIVE_STAGES, NATIVE_TIMED, new_stage_buffer

# row -> the cost-model stages (explain/cost.py) it is compared with
COVERS = {
    "embedding": ("embedding",),
    "rmsnorm_attn": ("rmsnorm_attn",),
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "rope": ("rope",),
    "kv_write": ("kv_write",),
    "attention": ("attn_scores", "softmax", "attn_weighted_sum"),
    "o_proj": ("o_proj",),
    "residual": ("residual_attn", "residual_ffn"),
    "rmsnorm_ffn": ("rmsnorm_ffn",),
    "gate_up_silu": ("gate_proj", "up_proj", "silu_mul"),
    "down_proj": ("down_proj",),
    "moe_ffn": ("router", "gate_proj", "up_proj", "silu_mul", "down_proj"),
    "final_norm": ("final_norm",),
    "lm_head": ("lm_head",),
    "sampling": ("sampling",),
    "other": (),
}
ROW_ORDER = tuple(COVERS)

# module path inside a DecoderLayer -> clock key; "_" keys are parents whose children are subtracted
_LAYER_MODULES = {
    "": "_layer", "input_layernorm": "rmsnorm_attn", "self_attn": "_self_attn",
    "self_attn.rotary_emb": "rope", "self_attn.kv_write": "kv_write", "self_attn.attn": "attention",
    "self_attn.o_proj": "o_proj", "post_attention_layernorm": "rmsnorm_ffn",
    "mlp": "_mlp", "mlp.down_proj": "down_proj", "block_sparse_moe": "moe_ffn",
}
_TOP_MODULES = {"model.embed_tokens": "embedding", "model.norm": "final_norm", "lm_head": "lm_head"}
# the native call's stage slots (decode_stack.NATIVE_STAGES) -> the row each is added to
NATIVE_ROWS = {"rmsnorm_attn": "rmsnorm_attn", "qkv_proj": "qkv_proj", "rope": "rope", "kv_write": "kv_write",
               "attention": "attention", "o_proj": "o_proj", "residual_attn": "residual",
               "rmsnorm_ffn": "rmsnorm_ffn", "gate_up": "gate_up_silu", "silu_mul": "gate_up_silu",
               "down_proj": "down_proj", "residual_ffn": "residual"}
assert set(NATIVE_ROWS) == set(NATIVE_STAGES) and set(NATIVE_ROWS.values()) <= set(COVERS)
# modules the fused path never calls (never timed on their own)
NOT_TIMED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "act_fn")


def fusion_notes(model: nn.Module) -> dict[str, str]:
    """Rows that one native call covers in this model, with what it fuses."""
    notes = {}
    layer = model.model.layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if getattr(attn, "_float_qkv", None) is not None:
        notes["qkv_proj"] = ("q_proj, k_proj and v_proj are one fused matmul call over their three matrices "
                             "(up to the GEMV's rows; more rows: three matmuls)")
    elif getattr(attn, "_quant_qkv", None) is not None:
        notes["qkv_proj"] = ("q_proj, k_proj and v_proj are one fused matmul call over their quantized "
                             "blocks (activations quantized once)")
    else:
        notes["qkv_proj"] = "q_proj, k_proj and v_proj: three matmuls, timed together"
    if getattr(mlp, "_float_gate_up", None) is not None:
        notes["gate_up_silu"] = ("gate_proj and up_proj are one fused matmul call over their two matrices "
                                 "(up to the GEMV's rows; more rows: two matmuls), then one native SiLU-and-multiply")
    elif getattr(mlp, "_quant_gate_up", None) is not None:
        notes["gate_up_silu"] = ("gate_proj and up_proj are one fused matmul call over their quantized blocks, "
                                 "then one native SiLU-and-multiply")
    else:
        notes["gate_up_silu"] = "gate_proj, up_proj and the SiLU gate, timed together"
    notes["attention"] = "scores, softmax and weighted sum are one fused kernel (SDPA or the native paged kernel)"
    return notes


class StageClock:
    """Seconds per row while attached; see the module docstring for the rows.

    Each timed module gets a ``forward`` of its own (an instance attribute wrapping the
    class's): a forward hook would cost the slower hooked call path of ``nn.Module`` on
    300 modules per step, about 20% of a SmolLM2 decode step; the wrapper costs two clock
    reads. The wrapped modules still run the same code.

    While attached, a native decode stack (``native_stage_seconds``) carries this clock's
    stage buffer; ``take`` reads and clears it, and ``native_calls`` says how many native
    calls filled it since the last ``take`` before that one.

    An MoE model's experts are watched too (``experts``, engine/trace_experts.py): which
    experts each layer's router chose, read with ``take_experts``.

    Invariant: after ``detach()`` no module carries a wrapper of this clock's (its
    ``forward`` is the class's again) and the stack no buffer.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._wrapped: list[nn.Module] = []
        self._seconds: dict[str, float] = defaultdict(float)
        self._native = new_stage_buffer()  # (len(NATIVE_STAGES) + 1,) float64
        self.native_calls = 0
        self.experts = ExpertRecorder(model)

    @property
    def attached(self) -> bool:
        return bool(self._wrapped)

    def attach(self) -> None:
        if self._wrapped:
            return
        for path, key in _TOP_MODULES.items():
            self._wrap(self.model.get_submodule(path), key)
        for layer in self.model.model.layers:
            for path, key in _LAYER_MODULES.items():
                try:
                    module = layer.get_submodule(path)
                except AttributeError:
                    continue  # dense layers have no block_sparse_moe, MoE layers no mlp
                self._wrap(module, key)
        stack = self.model.model
        if hasattr(stack, "native_stage_seconds"):  # kernels/decode_stack.CPUDecoderStack
            self._native.zero_()
            stack.native_stage_seconds = self._native
        self.experts.attach(NATIVE_TIMED)

    def detach(self) -> None:
        self.experts.detach()
        for module in self._wrapped:
            del module.forward  # the instance attribute: the class's forward shows again
        self._wrapped.clear()
        if "native_stage_seconds" in vars(self.model.model):
            del self.model.model.native_stage_seconds  # the class's None shows again

    def _wrap(self, module: nn.Module, key: str) -> None:
        inner, seconds, clock = module.forward, self._seconds, time.perf_counter

        def timed_forward(*args, **kwargs):
            start = clock()
            output = inner(*args, **kwargs)
            seconds[key] += clock() - start
            return output

        setattr(timed_forward, NATIVE_TIMED, True)  # times the module path; the native call times itself
        module.forward = timed_forward
        self._wrapped.append(module)

    def take_experts(self) -> dict[int, dict[int, int]]:
        """{MoE layer: {expert the router chose: tokens routed to it}} since the last call."""
        return self.experts.take()

    def take(self) -> dict[str, float]:
        """Rows since the last call (parents minus their timed children), then reset."""
        s = dict(self._seconds)
        self._seconds.clear()
        native = self._native.tolist()
        self._native.zero_()
        self.native_calls = int(native[-1])
        get = s.get
        rows = {k: v for k, v in s.items() if not k.startswith("_")}
        if self.native_calls:
            for name, seconds in zip(NATIVE_STAGES, native):
                row = NATIVE_ROWS[name]
                rows[row] = rows.get(row, 0.0) + seconds
        if "_self_attn" in s:
            children = get("rope", 0) + get("kv_write", 0) + get("attention", 0) + get("o_proj", 0)
            rows["qkv_proj"] = max(0.0, s["_self_attn"] - children)
        if "_mlp" in s:
            rows["gate_up_silu"] = max(0.0, s["_mlp"] - get("down_proj", 0))
        if "_layer" in s:
            inside = (get("rmsnorm_attn", 0) + get("_self_attn", 0) + get("rmsnorm_ffn", 0)
                      + get("_mlp", 0) + get("moe_ffn", 0))
            rows["residual"] = max(0.0, s["_layer"] - inside)
        return rows
