"""A ModelConfig from a GGUF file's header, without dequantizing any tensor.

The cost model needs shapes only. When the weights package offers a metadata-only config
reader it is used; otherwise the header is read here with ``gguf.GGUFReader`` (which
memory-maps the file and touches no tensor data).
"""

from __future__ import annotations

from pathlib import Path

from inferpath.config import ModelConfig


def gguf_model_config(path: Path) -> ModelConfig:
    try:  # prefer the weights package's own reader when it exists
        from inferpath.weights import read_gguf_config  # type: ignore[attr-defined]
    except ImportError:
        read_gguf_config = None
    if read_gguf_config is not None:
        return read_gguf_config(path)
    return _read_header(path)


def _read_header(path: Path) -> ModelConfig:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def get(key: str, default=None):
        field = reader.fields.get(key)
        return field.contents() if field is not None else default

    arch = get("general.architecture")
    if arch is None:
        raise ValueError(f"{path}: GGUF header has no general.architecture")
    tensor_names = {t.name for t in reader.tensors}
    num_experts = int(get(f"{arch}.expert_count", 0) or 0)
    heads = int(get(f"{arch}.attention.head_count"))
    hidden = int(get(f"{arch}.embedding_length"))
    vocab = get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    hf = {
        "model_type": "mixtral" if arch == "llama" and num_experts else arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(get(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(get(f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get(f"{arch}.rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "num_local_experts": num_experts,
        "num_experts_per_tok": int(get(f"{arch}.expert_used_count", 0) or 0),
    }
    return ModelConfig.from_hf_config(hf, name=path.stem)
