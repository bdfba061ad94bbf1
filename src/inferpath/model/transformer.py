"""The decoder-only transformer (every family of families.py) in the seed's stage order.

    embed_tokens (row lookup)
    N x layer: input_layernorm -> self_attn (q/k/v_proj -> rotary_emb -> kv_write -> attn
               -> o_proj) -> +residual -> post_attention_layernorm -> mlp (gate_proj,
               up_proj -> act_fn -> down_proj) or block_sparse_moe -> +residual
    norm, then lm_head on the rows whose logits are needed (``compute_logits``)

Module names are Hugging Face's, so ``state_dict()`` keys are checkpoint tensor names and
``load_weights`` is a direct name match. The file stays plain: no timing, quantization or
compilation here; those wrap modules from outside.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.config import ROUTED_MOE_ARCHITECTURES, ModelConfig, require_engine_support
from inferpath.model.attention_plan import build_attention_plan
from inferpath.model.batch_invariant import decode_x_passes, rows_must_be_invariant
from inferpath.model.layers import RMSNorm, gated_mlp, make_norm
from inferpath.model.metadata import AttentionMetadata
from inferpath.model.deepseek_moe import DeepseekMoE
from inferpath.model.mixer import token_mixer
from inferpath.model.mla import mla_rope_config
from inferpath.model.llama4 import PrescaledSigmoidMoE
from inferpath.model.moe import FusedBiasedMoE, GroupedSigmoidMoE, RoutedMoE, SparseMoE
from inferpath.model.rope import RopeTable

# Tensors some checkpoints carry that the model recomputes; ignored when loading.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """Checkpoint tensors do not match the model built from its config."""


class DecoderLayer(nn.Module):
    """One transformer block: pre-norm attention and pre-norm FFN, each added to the residual.

    Norm placements: pre-norms (Llama: ``input_layernorm`` before attention,
    ``post_attention_layernorm`` before the FFN); sandwich (Gemma: those plus a norm on each
    block's output, ``post_attention_layernorm`` then on the attention's output); post-norms
    (OLMo 2: only the outputs are normed, by ``post_attention_layernorm`` and
    ``post_feedforward_layernorm``). Granite scales each block's output by
    ``residual_multiplier`` before its residual add.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, rope_table: RopeTable) -> None:
        super().__init__()
        norm = lambda: make_norm(config.hidden_size, config.rms_norm_eps, config.norm_weight_offset)  # noqa: E731
        self.post_norms = config.post_norms
        if not config.post_norms:
            self.input_layernorm = norm()
        # self_attn (attention of any kind) or linear_attn (Gated DeltaNet): model/mixer.py
        self.mixer_name, mixer = token_mixer(config, layer_idx, rope_table)
        setattr(self, self.mixer_name, mixer)
        # NOTE: with sandwich norms (Gemma 3) post_attention_layernorm normalises the attention
        # output before the residual add, and the FFN has a norm of its own on each side
        self.post_attention_layernorm = norm()
        self.sandwich_norms = config.sandwich_norms
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = norm()
        if config.sandwich_norms or config.post_norms:
            self.post_feedforward_layernorm = norm()
        self.residual_multiplier = config.residual_multiplier
        self.is_moe = (config.is_moe_layer(layer_idx)
                       and config.architecture not in (*ROUTED_MOE_ARCHITECTURES, "deepseek_v3", "qwen3_next",
                                                      "qwen3_5_moe_text"))
        if config.is_moe_layer(layer_idx) and config.architecture == "deepseek_v3":
            self.mlp = DeepseekMoE(config)  # sigmoid scores, grouped top-k, shared experts
        elif self.is_moe:
            self.block_sparse_moe = SparseMoE(config.hidden_size, config.intermediate_size,
                                              config.num_experts, config.num_experts_per_tok)
        elif config.is_moe_layer(layer_idx) and config.moe_router == "sigmoid_grouped":  # GLM-4 MoE
            self.mlp = GroupedSigmoidMoE(config.hidden_size, config.expert_intermediate_size, config.num_experts,
                                         config.num_experts_per_tok, config.norm_topk_prob, config.num_expert_groups,
                                         config.num_topk_groups, config.routed_scaling_factor,
                                         config.shared_expert_intermediate_size)
        elif config.is_moe_layer(layer_idx) and config.moe_router == "topk_softmax":  # gpt-oss
            self.mlp = FusedBiasedMoE(config.hidden_size, config.expert_intermediate_size, config.num_experts,
                                      config.num_experts_per_tok, config.swiglu_limit, config.swiglu_alpha)
        elif config.is_moe_layer(layer_idx) and config.moe_router == "sigmoid_prescaled":  # Llama 4
            self.mlp = PrescaledSigmoidMoE(config.hidden_size, config.expert_intermediate_size, config.num_experts,
                                           config.num_experts_per_tok, config.shared_expert_intermediate_size)
        elif config.is_moe_layer(layer_idx):  # OLMoE, Qwen2-MoE, Qwen3-MoE: experts under ``mlp``
            self.mlp = RoutedMoE(config.hidden_size, config.expert_intermediate_size, config.num_experts,
                                 config.num_experts_per_tok, config.norm_topk_prob,
                                 config.shared_expert_intermediate_size)
        else:
            self.mlp = gated_mlp(config.hidden_size, config.intermediate_size, config.hidden_act, config.mlp_bias)
        if config.architecture == "llama4_text":  # its checkpoints name every FFN "feed_forward"
            self.feed_forward = self._modules.pop("mlp")
        self.ffn_name = "block_sparse_moe" if self.is_moe else "feed_forward" if hasattr(self, "feed_forward") else "mlp"

    def forward(self, positions, hidden, kv_cache, plan) -> torch.Tensor:
        # hidden: (num_tokens, hidden_size), the running residual stream
        ffn = getattr(self, self.ffn_name)  # mlp, block_sparse_moe (Mixtral) or feed_forward (Llama 4)
        mixer = getattr(self, self.mixer_name)  # self_attn, or linear_attn (Gated DeltaNet)
        if self.post_norms:  # OLMo 2
            hidden = hidden + self.post_attention_layernorm(mixer(positions, hidden, kv_cache, plan))
            return hidden + self.post_feedforward_layernorm(ffn(hidden))
        attended = mixer(positions, self.input_layernorm(hidden), kv_cache, plan)
        if self.residual_multiplier != 1.0:  # Granite
            hidden = hidden + attended * self.residual_multiplier
            return hidden + ffn(self.post_attention_layernorm(hidden)) * self.residual_multiplier
        if self.sandwich_norms:
            hidden = hidden + self.post_attention_layernorm(attended)
            return hidden + self.post_feedforward_layernorm(ffn(self.pre_feedforward_layernorm(hidden)))
        hidden = hidden + attended
        return hidden + ffn(self.post_attention_layernorm(hidden))


class DecoderStack(nn.Module):
    """Embedding, the layers and the final norm (Hugging Face's ``model.`` prefix)."""

    def __init__(self, config: ModelConfig, rope_tables: dict[bool, RopeTable]) -> None:
        super().__init__()
        # NOTE: an explicit (uninitialised) weight skips nn.Embedding's normal_ init, whose
        # first call on the meta device imports PyTorch's decompositions: 4-6 s of load time
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        # rope_tables: is the layer sliding -> its RoPE (Gemma 3's local layers have their own)
        self.layers = nn.ModuleList(DecoderLayer(config, i, rope_tables[bool(config.layer_window(i))])
                                    for i in range(config.num_layers))
        self.norm = make_norm(config.hidden_size, config.rms_norm_eps, config.norm_weight_offset)
        self.embedding_multiplier = config.embedding_multiplier
        self.config = config  # what a capability check reads (families.py)

    def forward(self, input_ids, positions, kv_cache, plan) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # (num_tokens, hidden_size): rows copied, no arithmetic
        # Gemma: times sqrt(hidden_size), Granite: its embedding_multiplier; rounded to the dtype first
        if self.embedding_multiplier != 1.0:
            hidden = hidden * torch.tensor(self.embedding_multiplier, dtype=hidden.dtype)
        for layer in self.layers:
            hidden = layer(positions, hidden, kv_cache, plan)
        return self.norm(hidden)


class Transformer(nn.Module):
    """A decoder-only LM over a flat batch of new tokens and a paged KV cache.

    Parameters are allocated uninitialised; call ``load_weights`` (or
    ``init_random_weights`` for tests and benchmarks) before ``forward``. With
    ``tie_word_embeddings`` the LM head shares ``model.embed_tokens.weight``. Parameters
    never require grad. Per step: ``forward`` over the flat batch of new tokens, then
    ``compute_logits`` on the rows that sample (the last token of each sequence).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        super().__init__()
        require_engine_support(config)  # never build a model explain prices but this file lacks
        self.config = config
        self.rope_table = RopeTable(mla_rope_config(config))  # MLA: the RoPE part of each head only
        self.local_rope_table = RopeTable(config.local_rope_config()) if config.local_rope_theta is not None else None
        with torch.device("meta"):
            self.model = DecoderStack(config, {False: self.rope_table,
                                               True: self.local_rope_table or self.rope_table})
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.to(dtype)
        _allocate_uninitialised(self, device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.requires_grad_(False)  # inference only: no autograd graph even outside inference_mode
        # every token attends through its own exact plan (attention.per_token_plan); set by
        # model/batch_invariant.py, which also makes the linears row-independent
        self.batch_invariant = False

    @property
    def dtype(self) -> torch.dtype:
        # the final norm's: never quantized, so this holds when weights are swapped from outside
        return self.model.norm.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache,
                meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: (num_tokens,) -> final-normed hidden (num_tokens, hidden_size).

        Writes this step's K/V into ``kv_cache`` at ``meta.slot_mapping``. No host syncs:
        lengths come from the host lists in ``meta``.
        """
        self.rope_table.begin_step(positions, self.dtype, meta.max_seq_len, meta)
        if self.local_rope_table is not None:
            self.local_rope_table.begin_step(positions, self.dtype, meta.max_seq_len, meta)
        # one plan per distinct sliding window (0 = full attention), shared by its layers
        windows = {self.config.layer_window(i) for i in range(self.config.num_layers)}
        # per token inside row_invariant_dispatch too (a sub-batch of seeded requests)
        invariant = self.batch_invariant or rows_must_be_invariant()
        plans = {w: build_attention_plan(meta, self.config.head_dim, w, invariant,
                                         self.config.attention_scale, self.config.attn_logit_softcapping)
                 for w in windows}
        for chunk in {self.config.layer_chunk(i) for i in range(self.config.num_layers)} - {0}:  # Llama 4
            plans[("chunk", chunk)] = build_attention_plan(meta, self.config.head_dim, 0, self.batch_invariant,
                                                           self.config.attention_scale, None, chunk)
        if self.config.num_linear_layers:  # Gated DeltaNet layers read the step's sequences and state slots
            plans["linear"] = meta
        return self.model(input_ids, positions, kv_cache, plans)

    def compute_logits(self, hidden: torch.Tensor, vocab: tuple[int, int] | None = None) -> torch.Tensor:
        """LM head on the given rows only: (num_rows, hidden_size) -> (num_rows, vocab) float32,
        a quantized head's x in a decode step's int8 passes whatever the rows (batch_invariant).
        ``vocab`` (start, stop): the logits of token ids start..stop-1 alone, the head's rows
        read for them only (head_rows; a draft model's head over part of the vocabulary)."""
        with decode_x_passes():
            logits = self.lm_head(hidden) if vocab is None else head_rows(self.lm_head, hidden, *vocab)
        if self.config.logits_scaling != 1.0:  # Granite
            logits = logits / self.config.logits_scaling
        cap = self.config.final_logit_softcapping
        if cap:  # Gemma: squash into (-cap, cap), in the model's dtype as transformers does
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    # ------------------------------------------------------------------ weights
    def expected_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor name -> shape; a tied head contributes no ``lm_head.weight``."""
        return {name: tuple(p.shape) for name, p in self.named_parameters()}

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy checkpoint tensors in by name, converting to the model's dtype and device.

        Raises WeightLoadError naming the first missing tensor, the first shape mismatch
        (with both shapes) or the unexpected tensors. Tensors already in the right dtype,
        device and layout are used without a copy.
        """
        params = dict(self.named_parameters())
        missing = [name for name in params if name not in tensors]
        if missing:
            name = missing[0]
            raise WeightLoadError(
                f"checkpoint is missing tensor {name!r} (expected shape {tuple(params[name].shape)})"
                + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
            )
        unexpected = [name for name in tensors if name not in params and not self._is_ignorable(name)]
        if unexpected:
            raise WeightLoadError(
                f"checkpoint has {len(unexpected)} tensor(s) this {self.config.architecture} model does "
                f"not use, e.g. {unexpected[0]!r}"
            )
        for name, param in params.items():
            tensor = tensors[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise WeightLoadError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                )
        for name, param in params.items():
            param.data = tensors[name].to(device=param.device, dtype=param.dtype).contiguous()

    def _is_ignorable(self, name: str) -> bool:
        if name.endswith(_IGNORED_SUFFIXES):
            return True
        return name == "lm_head.weight" and self.config.tie_word_embeddings

    @torch.no_grad()
    def init_random_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Deterministic random weights (norms = 1, biases = 0): for tests and benchmarks."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if isinstance(self.get_submodule(name.rsplit(".", 1)[0]), RMSNorm):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
                param.copy_(values)


def _allocate_uninitialised(module: nn.Module, device: str | torch.device) -> None:
    """Give each meta parameter and buffer its own uninitialised storage on ``device``.

    NOTE: what ``Module.to_empty`` does, minus its ``torch.empty_like`` of meta tensors,
    whose first call imports sympy (~0.4 s of every load).
    """
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in table.items():
                if tensor is None or not tensor.is_meta:
                    continue
                empty = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
                table[name] = nn.Parameter(empty, requires_grad=False) if table is sub._parameters else empty


def build_model(checkpoint, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Transformer:
    """A Transformer for ``checkpoint.config`` with ``checkpoint.tensors`` loaded, in eval mode."""
    model = Transformer(checkpoint.config, dtype=dtype, device=device)
    model.load_weights(checkpoint.tensors)
    return model.eval()


def head_rows(head: nn.Module, hidden: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Outputs start..stop-1 of an LM head (a QuantLinear's ``forward_rows``: its weight's rows
    read for them only; a float ``nn.Linear``: its weight's row slice), in the head's dtype."""
    forward_rows = getattr(head, "forward_rows", None)
    if forward_rows is not None:
        return forward_rows(hidden, start, stop)
    if isinstance(head, nn.Linear):
        weight = head.weight[start:stop]
        bias = None if head.bias is None else head.bias[start:stop]
        return nn.functional.linear(hidden.to(weight.dtype), weight, bias)
    raise TypeError(f"an LM head of type {type(head).__name__} cannot compute part of the vocabulary")


def head_rows_supported(head: nn.Module) -> bool:
    """Whether head_rows serves this LM head."""
    return getattr(head, "forward_rows", None) is not None or isinstance(head, nn.Linear)
