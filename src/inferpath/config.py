"""ModelConfig: validated once, frozen; the architectures the engine runs.

ModelConfig is the one description of a model's shapes that every part of inferpath
reads: the model builds its layers from it, the KV cache sizes its tensors from it, and
the cost model (explain/) turns it into bytes and FLOPs. It comes from a Hugging Face
``config.json``, from GGUF metadata (weights/gguf.py builds the dict), or from a named
preset of a well-known model. Its fields are checked by config_checks.py (and
config_kinds.py, for layers of several kinds). EngineConfig (engine_config.py) and
ConfigError (errors.py) are re-exported from here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from inferpath.config_checks import check_model_config
from inferpath.config_kinds import engine_unsupported_fields, linear_state_values
from inferpath.engine_config import EngineConfig  # noqa: F401 (re-exported)
from inferpath.errors import ConfigError
from inferpath.families import FAMILIES
from inferpath.hf_config import UnsupportedFieldError, model_config_kwargs

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
# MoE architectures whose experts sit under ``mlp`` with Llama names (model/moe.py RoutedMoE)
ROUTED_MOE_ARCHITECTURES = tuple(name for name, f in FAMILIES.items() if f.routed_moe)
# Architectures the cost model (explain/) prices but the engine does not run: ModelConfig
# accepts them, the loader and the model refuse them by name (``require_engine_support``).
PRICED_ARCHITECTURES: tuple[str, ...] = ()
# Architectures of layers of several kinds that the engine runs too (model/mla.py,
# model/deepseek_moe.py; model/gated_deltanet.py, model/qwen3_next.py)
# Qwen3.5 (text-only ForCausalLM checkpoints): Qwen3-Next's layers, its linear projections stored apart
KIND_ARCHITECTURES = ("deepseek_v3", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a decoder-only transformer (Llama family).

    Invariants: num_heads % num_kv_heads == 0; head_dim * num_heads need not equal
    hidden_size (some models decouple them). ``num_experts == 0`` means a dense SwiGLU
    FFN; otherwise a mixture of experts routed top-``num_experts_per_tok``.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # rope_scaling as a tuple of (key, value) pairs so the config stays hashable/frozen;
    # read it with ``rope_scaling_dict``.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # a bias on the Q, K and V projections (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False  # a bias on the output projection too (Llama's attention_bias)
    mlp_bias: bool = False  # biases on gate_proj, up_proj and down_proj (Llama's mlp_bias)
    hidden_act: str = "silu"  # the gate's activation: silu, gelu or gelu_pytorch_tanh
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each routed expert's width; 0 = intermediate_size
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1 (Mixtral)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert; 0 = none
    # layers whose FFN is a dense MLP of intermediate_size although num_experts > 0
    # (Qwen2-MoE's mlp_only_layers / decoder_sparse_step)
    dense_layers: tuple[int, ...] = ()
    # RMSNorm on Q and K before RoPE: "" none, "projection" over all heads at once (OLMoE,
    # OLMo 2), "head" over each head (Gemma 3, Qwen3)
    qk_norm: str = ""
    # Gemma 2 and 3: RMSNorm weights stored as w - 1 (the norm multiplies by 1 + w), a norm after
    # attention and around the FFN ("sandwich"), embeddings times sqrt(hidden_size),
    # attention scaled by query_pre_attn_scalar ** -0.5, and sliding layers with their own
    # RoPE base and scaling
    norm_weight_offset: float = 0.0
    sandwich_norms: bool = False
    embedding_multiplier: float = 1.0
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap)
    # Gemma 2: attention scores -> cap * tanh(scores / cap) before the mask and softmax
    attn_logit_softcapping: float | None = None
    local_rope_theta: float | None = None
    local_rope_scaling: tuple[tuple[str, Any], ...] | None = None
    sliding_window: int | None = None
    # per layer "full_attention" or "sliding_attention"; None: every layer slides iff
    # sliding_window is set
    layer_types: tuple[str, ...] | None = None
    # layers whose Q and K get no RoPE at all (SmolLM3's no_rope_layers: every 4th)
    no_rope_layers: tuple[int, ...] = ()
    # OLMo 2: no norm before attention or the MLP; each one's output is normed before the
    # residual add (post_attention_layernorm, post_feedforward_layernorm)
    post_norms: bool = False
    # Granite: the factor on q . k itself (replaces head_dim ** -0.5), each block's output
    # times residual_multiplier before its residual add, logits divided by logits_scaling
    attention_multiplier: float | None = None
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # GLM-4: RoPE turns only the first rotary_dim of each head's dimensions (0 = all of them)
    rotary_dim: int = 0
    # the experts' router: "softmax" (top-k of a softmax), or "sigmoid_grouped" (GLM-4 MoE:
    # sigmoid scores, a per-expert correction bias that only chooses, the best
    # num_expert_groups groups' experts, weights times routed_scaling_factor); GLM-4's
    # shared experts are shared_expert_intermediate_size wide with no gate
    moe_router: str = "softmax"
    num_expert_groups: int = 1
    num_topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    # gpt-oss: "topk_softmax" routing (a router with a bias; softmax over the top-k logits);
    # experts stored fused with biases, gated by a clamped SwiGLU: gate clamped above and up
    # both ways at swiglu_limit, (up + 1) * gate * sigmoid(swiglu_alpha * gate); a learned
    # per-head sink logit in each attention softmax
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    attention_sinks: bool = False
    # Llama 4: layers that layer_types names "chunked_attention" attend only within their own
    # chunk of attention_chunk_size positions (key // size == query // size); qk_norm
    # "l2_rope": Q and K of the RoPE layers divided by their RMS (no weight) after RoPE;
    # NoPE layers scale Q by 1 + attn_temperature_scale * log1p(floor((position + 1) /
    # attn_temperature_floor)) (attn_temperature_floor 0: off); moe_router
    # "sigmoid_prescaled": top-k router logits through a sigmoid, each chosen expert run on
    # the token times its score, plus an ungated shared expert
    attention_chunk_size: int = 0
    attn_temperature_floor: int = 0
    attn_temperature_scale: float = 0.0
    # Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = not MLA. Each token caches
    # one latent of kv_lora_rank values and one RoPE key of qk_rope_head_dim shared by the
    # heads; a head's query/key is qk_nope_head_dim + qk_rope_head_dim wide, its value
    # v_head_dim; q_lora_rank 0 = a full-rank q_proj.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek MoE (model/deepseek_moe.py): num_shared_experts always-on experts of
    # moe_intermediate_size each; router scores "softmax" or "sigmoid", a correction bias added
    # for selection only; top-k among the experts of the best topk_group of n_group groups;
    # routed weights times routed_scaling_factor (the field above, shared with GLM-4 MoE).
    # NOTE: GLM-4 MoE's moe_router="sigmoid_grouped" is the same routing under other fields.
    num_shared_experts: int = 0
    router_scoring: str = "softmax"
    router_correction_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    # Gated DeltaNet linear attention (Qwen3-Next) on the layers layer_types names
    # "linear_attention"; 0 = none
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False  # full attention's output times sigmoid(a gate from q_proj)
    partial_rotary_factor: float = 1.0  # the share of head_dim RoPE rotates
    rope_interleave: bool = False  # DeepSeek: RoPE dims stored as interleaved pairs
    # Qwen3.5: the Gated DeltaNet's q/k/v, z, b and a projections stored apart, not grouped per key head
    linear_split_projections: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES + KIND_ARCHITECTURES + PRICED_ARCHITECTURES:
            raise ConfigError(
                f"architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        check_model_config(self)  # every field in range (config_checks.py, config_kinds.py)

    @property
    def attention_scale(self) -> float:
        """The factor on q . k: attention_multiplier where set (Granite), else
        query_pre_attn_scalar ** -0.5 where set (Gemma), else head_dim ** -0.5."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def local_rope_config(self) -> "ModelConfig":
        """This config as the RoPE of sliding-window layers sees it (Gemma 3's local base)."""
        if self.local_rope_theta is None:
            return self
        return replace(self, rope_theta=self.local_rope_theta, rope_scaling=self.local_rope_scaling)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.num_experts > 0 and layer_idx not in self.dense_layers

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def layer_window(self, layer_idx: int) -> int:
        """The sliding window of layer ``layer_idx``; 0 when it attends to the whole context."""
        if not self.sliding_window:
            return 0
        if self.layer_types is None or self.layer_types[layer_idx] == "sliding_attention":
            return self.sliding_window
        return 0

    def layer_chunk(self, layer_idx: int) -> int:
        """The attention chunk of layer ``layer_idx`` (Llama 4); 0 when it is not chunked."""
        if self.layer_types is not None and self.layer_types[layer_idx] == "chunked_attention":
            return self.attention_chunk_size
        return 0

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """The seed's formula: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.

        MLA caches one latent and one RoPE key a layer: layers x (kv_lora_rank +
        qk_rope_head_dim) x dtype bytes; a hybrid model caches K and V on its attention layers
        only (its linear layers keep a fixed state instead, ``state_bytes_per_sequence``)."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_linear_attention_layer(self, layer_idx: int) -> bool:
        return self.layer_types is not None and self.layer_types[layer_idx] == "linear_attention"

    @property
    def num_linear_layers(self) -> int:
        return sum(t == "linear_attention" for t in self.layer_types or ())

    @property
    def num_attention_layers(self) -> int:
        """Layers that cache K and V (all but the linear-attention ones)."""
        return self.num_layers - self.num_linear_layers

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """The fixed state a sequence owns in each linear-attention layer, whatever its length:
        the short convolution's last kernel-1 inputs (q, k and v channels) and the delta
        rule's matrix (value heads x key dim x value dim); 0 without linear layers."""
        return self.num_linear_layers * linear_state_values(self) * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rope_scaling"] = self.rope_scaling_dict
        return d

    def with_name(self, name: str) -> "ModelConfig":
        return replace(self, name=name)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "") -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict; every field must be implemented or
        known harmless (hf_config.py), else ConfigError naming it."""
        model_type = cfg.get("model_type")
        if model_type is None:
            raise ConfigError("config.json has no 'model_type'; expected one of "
                              + ", ".join(SUPPORTED_ARCHITECTURES))
        if model_type not in SUPPORTED_ARCHITECTURES + KIND_ARCHITECTURES + PRICED_ARCHITECTURES:
            raise ConfigError(f"architecture {model_type!r} is not supported; "
                              f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        try:
            kwargs = model_config_kwargs(cfg)
        except KeyError as exc:
            raise ConfigError(f"config.json is missing required field {exc.args[0]!r}") from None
        except UnsupportedFieldError as exc:
            raise ConfigError(str(exc)) from None
        kwargs["rope_scaling"] = _freeze(kwargs["rope_scaling"])
        kwargs["local_rope_scaling"] = _freeze(kwargs.get("local_rope_scaling"))
        return cls(**kwargs, name=name)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_hf_config(data, name=path.parent.name)


def require_engine_support(config: ModelConfig) -> None:
    """ConfigError unless the engine implements ``config.architecture`` (explain may price more)."""
    if config.architecture in PRICED_ARCHITECTURES:
        raise ConfigError(f"architecture {config.architecture!r} is priced by explain but not implemented "
                          f"by the engine; the engine runs: {', '.join(SUPPORTED_ARCHITECTURES + KIND_ARCHITECTURES)}")
    fields = engine_unsupported_fields(config)
    if fields:
        raise ConfigError(f"ModelConfig field {fields[0]!r} (= {getattr(config, fields[0])!r}) is priced by "
                          f"explain but not implemented by the engine for {config.architecture!r}")


def _freeze(value: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    if not value:
        return None
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in value.items()))
