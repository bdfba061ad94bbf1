"""A decode step's layers in one native call, applied from outside like the other swaps.

A decode step of a small model is mostly Python: SmolLM2-135M makes ~12 kernel calls per
layer, 360 a step, each with its module call, kernel lookup, output allocation and ctypes
argument conversion (~8 us), which is as long as all its matmuls together.
``CPUDecoderStack`` runs the layers of a step whose every row is one sequence's next
token through ``inferpath_decode_layers`` (csrc/drivers/decode.c): the same kernels, in
the same order, on the same buffers' values, so the hidden states are equal to the bit to
the module-by-module path (a test holds it). Two kinds of model take it: GGUF-quantized
weights with float32 activations, and float32 or bfloat16 weights with activations of
their dtype — for the row counts whose module path runs the GEMV or, bf16 on an AMX CPU, the
AMX GEMM (1 to 4 rows the GEMV there, 5 to 128 AMX, which the call runs too, one projection
at a time as the modules do; past the GEMV's rows elsewhere, oneDNN, so the module path) —
and bf16 weights with float32 activations (kernels/bf16_weights.py), the weights widened
inside the GEMV. The call is granted, never assumed: the model's family must allow it and
every field of its ModelConfig must hold a value the call implements (families.py, an
allow-list: QK-norm, sandwich or post norms, soft-capping, MoE, non-SiLU gates, NoPE
layers, multipliers, or a feature added later stay off it), and every layer must hold the
native modules the call reads (exact types, through their public accessors).

A step's rows may also be short chunks of one sequence each (up to ``MAX_CHUNK_TOKENS``
tokens: a speculative verification of k drafts is a chunk of k + 1, and a short prompt
chunk), mixed with other sequences' decode rows: a chunk's rows are attended by the same
causal prefill kernel the module path runs for it (avx512/prefill_attention.c, or
avx2/prefill_attention.c at the avx2 and avxvnni levels, passed to the call), the decode
rows by the paged decode attention, so the result stays equal to the bit to the module
path. Where that kernel is not built (at the generic level the module path runs PyTorch's
SDPA for chunks), chunks take the module path.

A traced step stays native: the stage clock (engine/trace_stages.py) hands the stack a
buffer (``native_stage_seconds``) that the call fills with each stage's time
(``NATIVE_STAGES``), and its wrappers on the layer modules, which time only the module
path, are marked so that ``_Plan.watched`` passes them. Everything else — long prompt
chunks, a sliding window cutting a chunk's keys, a hooked or otherwise wrapped module
(tensor parallelism's all-reduce) — takes the module path.
"""

from __future__ import annotations

import ctypes
import operator
from itertools import repeat

import torch
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from inferpath.families import native_decode_refusal
from inferpath.kernels import build, ops
from inferpath.kernels.fused import CPUSelfAttention, CPUSwiGLUMLP, float_group, quant_group
from inferpath.kernels.groups import GGUF_FLOAT_TYPES, FloatGroup, QuantGroup
from inferpath.kernels.quantized import QuantLinear
from inferpath.model.batch_invariant import rows_must_be_invariant
from inferpath.model.transformer import DecoderStack

_P, _I64 = ctypes.c_void_p, ctypes.c_int64

# a chunk of more tokens than this (a prompt) takes the module path
MAX_CHUNK_TOKENS = 32
# the slots of the call's stage buffer (decode.c's STAGE_* order), each summed over the layers;
# one more slot counts the calls that filled them
NATIVE_STAGES = ("rmsnorm_attn", "qkv_proj", "rope", "kv_write", "attention", "o_proj", "residual_attn",
                 "rmsnorm_ffn", "gate_up", "silu_mul", "down_proj", "residual_ffn")
# set on a forward wrapper that times the module path only (the native call times itself)
NATIVE_TIMED = "_inferpath_native_timed"


class _WeightGroup(ctypes.Structure):  # decode.c weight_group: a QuantGroup's or FloatGroup's arrays
    _fields_ = [("count", ctypes.c_int), ("qtypes", _P), ("weights", _P), ("row_bytes", _P), ("rows", _P),
                ("biases", _P)]


class _Layer(ctypes.Structure):  # decode.c decode_layer
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("qkv", _WeightGroup), ("o", _WeightGroup),
                ("gate_up", _WeightGroup), ("down", _WeightGroup), ("k_cache", _P), ("v_cache", _P)]


class _Shape(ctypes.Structure):  # decode.c decode_shape
    _fields_ = [("hidden", _I64), ("num_heads", _I64), ("num_kv_heads", _I64), ("head_dim", _I64),
                ("intermediate", _I64), ("block_size", _I64), ("max_blocks", _I64), ("window", _I64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("dtype", ctypes.c_int), ("amx", _P),
                ("amx_groups", ctypes.c_int), ("kv_dtype", ctypes.c_int)]


class _Chunk(ctypes.Structure):  # decode.c decode_chunk
    _fields_ = [("first_row", _I64), ("rows", _I64), ("context", _I64), ("table", _P)]


class _Rows(ctypes.Structure):  # decode.c step_rows
    _fields_ = [("decode_rows", _P), ("num_decodes", _I64), ("block_tables", _P), ("seq_lens", _P),
                ("chunks", _P), ("num_chunks", _I64), ("prefill", _P), ("prefill_cached", _P)]


def new_stage_buffer() -> torch.Tensor:
    """A zeroed buffer for the call's stage times: (len(NATIVE_STAGES) + 1,) float64."""
    return torch.zeros(len(NATIVE_STAGES) + 1, dtype=torch.float64)


def _weights(group: QuantGroup | FloatGroup) -> _WeightGroup:
    count, *arrays = group.native_arguments()
    return _WeightGroup(count, *(ctypes.cast(array, _P) for array in arrays))


class _Plan:
    """What the native call needs of a model, built once: its layers' weights as ctypes
    structures (and the objects their pointers point into), or why it cannot run."""

    def __init__(self, stack: DecoderStack) -> None:
        self.dtype = stack.norm.weight.dtype  # of the activations, norms and KV cache
        layers = list(stack.layers)
        self.quantized = False
        self.reason = native_decode_refusal(stack.config)
        if self.reason:
            return
        attn = layers[0].self_attn
        self.quantized = isinstance(attn, CPUSelfAttention) and attn.qkv_group(quantized=True) is not None
        self.reason = self._check(stack, self.dtype, self.quantized)
        if self.reason:
            return
        self.decode_fn = build.native_decode_layers("quantized" if self.quantized else self.dtype)
        # the module path's prefill attention for chunks (None: chunks take the module path)
        prefill = build.native_prefill_attention(torch.float32 if self.quantized else self.dtype)
        self.prefill_fn = None if prefill is None else ctypes.cast(prefill, _P).value
        # a bfloat16 cache beside float32 activations: chunks with cached context read it through this
        # (built where prefill_fn is: the float32 library at avx2, avxvnni and avx512)
        cached = build.native_prefill_attention(torch.float32, kv_dtype=torch.bfloat16)
        self.prefill_cached_fn = None if cached is None else ctypes.cast(cached, _P).value
        modules = [m for layer in layers for m in layer.modules()]  # watched for hooks and wrappers
        self.hook_dicts = [m._forward_hooks for m in modules] + [m._forward_pre_hooks for m in modules]
        self.module_dicts = [m.__dict__ for m in modules]
        self.passed_forwards: list | None = None  # watched(): the instance forwards last passed
        self.groups = []  # keeps every ctypes array alive
        self.layers = (_Layer * len(layers))()
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            single = quant_group if self.quantized else float_group
            groups = [attn.qkv_group(self.quantized), single(attn.o_proj), mlp.gate_up_group(self.quantized),
                      single(mlp.down_proj)]
            self.groups += groups
            self.layers[i].input_norm = layer.input_layernorm.weight.data_ptr()
            self.layers[i].post_norm = layer.post_attention_layernorm.weight.data_ptr()
            self.layers[i].qkv, self.layers[i].o, self.layers[i].gate_up, self.layers[i].down = map(_weights, groups)
        self.first_groups = self.groups[:4]  # every layer's have the same shapes
        first = layers[0]
        self.rope = first.self_attn.rotary_emb
        self.window = first.self_attn.sliding_window
        self.num_heads, self.num_kv_heads = first.self_attn.num_heads, first.self_attn.num_kv_heads
        self.head_dim = first.self_attn.head_dim
        self.hidden = first.input_layernorm.weight.shape[0]
        self.intermediate = first.mlp.down_proj.in_features
        self.eps = first.input_layernorm.eps
        self.cache_key = None

    def serves(self, rows: int) -> bool:
        """Whether the module path runs ``rows`` rows through kernels the native call runs
        (else its results would differ): the fused quantized kernels, or for each float
        group the GEMV or the AMX GEMM (``amx_groups``)."""
        if self.quantized:
            return ops.quant_rows_fused(rows)
        return all(group.kernel(rows, self.dtype) in ("gemv", "amx") for group in self.first_groups)

    def amx_groups(self, rows: int) -> tuple[int | None, int]:
        """The AMX GEMM's address and decode.c's bitmask of a layer's groups (Q/K/V, o,
        gate/up, down: every layer's have the same shapes) whose projections the module path
        runs ``rows`` rows through AMX; (None, 0) where none does."""
        if self.quantized:
            return None, 0
        mask = sum(1 << i for i, group in enumerate(self.first_groups) if group.kernel(rows, self.dtype) == "amx")
        if not mask:
            return None, 0
        return ctypes.cast(self.first_groups[mask.bit_length() - 1].amx_gemm(self.dtype), _P).value, mask

    @staticmethod
    def _check(stack: DecoderStack, dtype: torch.dtype, quantized: bool) -> str:
        """Why this model's modules cannot take the native call ('' if they can): each layer
        must hold exactly the native modules the call reads. Its features are checked
        before, against the allow-list (families.py)."""
        from inferpath.kernels.modules import (  # modules imports this one
            CPULinear,
            CPUPagedAttention,
            CPURMSNorm,
            CPURotaryEmbedding,
            CPUSiluAndMul,
        )

        if not all(hasattr(layer, "self_attn") for layer in stack.layers):
            return "linear-attention layers (Gated DeltaNet)"
        if quantized and (build.native_decode_layers() is None or build.native_quant_matmul_group() is None):
            return "no native decode kernel here"
        if not quantized and (dtype not in GGUF_FLOAT_TYPES or build.native_decode_layers(dtype) is None):
            return f"no native decode kernel for {str(dtype).removeprefix('torch.')} here"
        layers = list(stack.layers)
        first = layers[0].self_attn
        activations = torch.float32 if quantized else dtype
        projection = QuantLinear if quantized else CPULinear
        for layer in layers:
            attn, mlp = layer.self_attn, getattr(layer, "mlp", None)
            norms = (getattr(layer, "input_layernorm", None), layer.post_attention_layernorm)
            if type(mlp) is not CPUSwiGLUMLP:
                return "not a plain SwiGLU layer"
            if any(type(n) is not CPURMSNorm or n.weight.dtype != activations or not n.has_native_kernel
                   for n in norms):
                return f"not a native {str(activations).removeprefix('torch.')} RMSNorm"
            if type(attn) is not CPUSelfAttention:
                return "attention is not the fused native module"
            qkv = attn.qkv_group(quantized)
            if not quantized and qkv is not None and not qkv.runs(activations):
                qkv = None
            if (qkv is None or type(attn.o_proj) is not projection
                    or type(attn.rotary_emb) is not CPURotaryEmbedding or type(attn.attn) is not CPUPagedAttention):
                return "attention is not quantized or native-GEMV Q/K/V with native RoPE and paged attention"
            gate_up = mlp.gate_up_group(quantized)
            if (gate_up is None or (not quantized and not gate_up.runs(activations))
                    or type(mlp.down_proj) is not projection or type(mlp.act_fn) is not CPUSiluAndMul):
                return "the MLP is not quantized or native-GEMV gate/up/down with a SiLU gate"
            if not quantized and not all((group := float_group(p)) is not None and group.runs(activations)
                                         for p in (attn.o_proj, mlp.down_proj)):
                return "a float projection the native GEMV does not serve"
            if attn.sliding_window != first.sliding_window or attn.rotary_emb.table is not first.rotary_emb.table:
                return "layers differ in window or RoPE"
        if first.head_dim % 32 or first.head_dim > ops.ATTENTION_MAX_HEAD_DIM \
                or first.num_heads // first.num_kv_heads > ops.ATTENTION_MAX_GROUP:
            return "head shape outside the native RoPE and attention kernels"
        return ""

    def watched(self) -> bool:
        """Whether any layer module is hooked or has its forward wrapped by anything but a
        stage clock's module-path timer (``NATIVE_TIMED``). Runs every decode step: C-level
        scans of the hook dicts and the modules' dicts (~10 us for SmolLM2's 450 modules;
        a traced step also looks at each wrapper)."""
        if any(self.hook_dicts) or _global_forward_hooks or _global_forward_pre_hooks:
            return True
        if not any(map(operator.contains, self.module_dicts, repeat("forward"))):
            return False
        # a traced step: the same wrappers as the last step that passed (a C-level list compare
        # by identity) pass again without looking at each
        forwards = list(map(dict.get, self.module_dicts, repeat("forward")))
        if forwards == self.passed_forwards:
            return False
        if any(f is not None and not getattr(f, NATIVE_TIMED, False) for f in forwards):
            return True
        self.passed_forwards = forwards
        return False


class CPUDecoderStack(DecoderStack):
    """``DecoderStack`` whose pure-decode steps run the layers in one native call (module
    doc); any other step, or a model the call cannot run, takes the parent's path.
    ``use_native_decode = False`` on an instance sends every step down the parent's path."""

    use_native_decode = True
    # a traced step's stage times (new_stage_buffer()), added to by the call; None: untraced
    native_stage_seconds: torch.Tensor | None = None

    def forward(self, input_ids, positions, kv_cache, plan) -> torch.Tensor:
        hidden = self._decode_natively(input_ids, positions, kv_cache, plan) if self.use_native_decode else None
        return super().forward(input_ids, positions, kv_cache, plan) if hidden is None else hidden

    def native_decode_refusal(self) -> str:
        """Why this model's layers cannot take the native call ('' if they can)."""
        return self._native_plan().reason

    def _native_plan(self) -> _Plan:
        native = self.__dict__.get("_native_decode_plan")
        if native is None:
            native = self.__dict__["_native_decode_plan"] = _Plan(self)
        return native

    def _decode_natively(self, input_ids, positions, kv_cache, plan) -> torch.Tensor | None:
        native = self._native_plan()
        if native.reason or len(plan) != 1 or native.window not in plan:
            return None
        step = plan[native.window]
        decode, chunks = step.decode, step.prefills
        activations = torch.float32 if native.quantized else native.dtype
        kv_dtype = kv_cache.k_caches[0].dtype  # the activations', or bf16 beside float32 (EngineConfig.kv_cache_dtype)
        mixed_kv = (activations, kv_dtype) == (torch.float32, torch.bfloat16)
        if (step.softcap or (kv_dtype != activations and not mixed_kv) or not native.serves(input_ids.shape[0])
                or (chunks and (native.prefill_fn is None
                                or any(c.windowed or c.query_len > MAX_CHUNK_TOKENS for c in chunks)))
                or native.watched()):
            return None
        hidden = self.embed_tokens(input_ids)  # (num_tokens, hidden_size)
        if hidden.dtype != activations:
            return None
        hidden = hidden.contiguous().clone()
        num_tokens = hidden.shape[0]
        # the caches of this engine: pointers set once. NOTE: every layer's pointers are the
        # key (~5 us a step): a model shared by engines one after another may find the first
        # cache of a new engine where the old one's was, and the others elsewhere
        key = (*map(torch.Tensor.data_ptr, kv_cache.k_caches), *map(torch.Tensor.data_ptr, kv_cache.v_caches),
               tuple(kv_cache.k_caches[0].shape))
        if native.cache_key != key:
            for i, layer in enumerate(native.layers):
                layer.k_cache, layer.v_cache = kv_cache.k_caches[i].data_ptr(), kv_cache.v_caches[i].data_ptr()
            native.cache_key = key
        cos, signed_sin = native.rope.table.cos_sin(positions, activations)  # (num_tokens, 1, head_dim) each
        cos = cos.reshape(num_tokens, native.head_dim).contiguous()
        signed_sin = signed_sin.reshape(num_tokens, native.head_dim).contiguous()
        rows, keep = self._rows(decode, chunks, native)
        slots = step.slot_mapping.contiguous()
        shape = _Shape(native.hidden, native.num_heads, native.num_kv_heads, native.head_dim, native.intermediate,
                       kv_cache.k_caches[0].shape[1], decode.blocks_per_seq if decode is not None else 0,
                       decode.sliding_window if decode is not None else native.window, native.eps, step.scale,
                       GGUF_FLOAT_TYPES[activations], *native.amx_groups(num_tokens), GGUF_FLOAT_TYPES[kv_dtype])
        times = self.native_stage_seconds
        status = native.decode_fn(
            native.layers, len(native.layers), ctypes.byref(shape), hidden.data_ptr(), num_tokens, cos.data_ptr(),
            signed_sin.data_ptr(), slots.data_ptr(), ctypes.byref(rows), torch.get_num_threads(),
            rows_must_be_invariant(), None if times is None else times.data_ptr())
        del keep
        if status != 0:
            raise RuntimeError(f"native decode of {num_tokens} rows ({len(chunks)} chunks) failed (status {status})")
        return self.norm(hidden)

    @staticmethod
    def _rows(decode, chunks, native: _Plan) -> tuple[_Rows, list]:
        """The call's step_rows for the plan's decode group and chunks, and the tensors and
        arrays its pointers point into (kept alive through the call)."""
        rows, keep = _Rows(), []
        if decode is not None:
            num_decodes = decode.seq_lens.shape[0]
            tables = decode.block_ids.view(num_decodes, decode.blocks_per_seq).contiguous()  # (num_decodes, blocks)
            seq_lens = decode.seq_lens.contiguous()
            keep += [tables, seq_lens]
            rows.num_decodes, rows.block_tables, rows.seq_lens = num_decodes, tables.data_ptr(), seq_lens.data_ptr()
            if decode.token_rows is not None:
                token_rows = decode.token_rows.contiguous()
                keep.append(token_rows)
                rows.decode_rows = token_rows.data_ptr()
        if chunks:
            array = (_Chunk * len(chunks))()
            for i, chunk in enumerate(chunks):
                table = None if chunk.block_ids is None else chunk.block_ids.contiguous()
                keep.append(table)
                array[i] = _Chunk(chunk.token_start, chunk.query_len, chunk.seq_len - chunk.query_len,
                                  None if table is None else table.data_ptr())
            keep.append(array)
            rows.chunks, rows.num_chunks, rows.prefill = ctypes.cast(array, _P), len(chunks), native.prefill_fn
            rows.prefill_cached = native.prefill_cached_fn
        return rows, keep
