"""A tiny Qwen3 that thinks, for the reasoning tests of the server (test_server_reasoning.py).

transformers builds a one-layer Qwen3 from a config; its weights are then set so that the
next token depends on the last one only: the attention and MLP outputs are zero, so the
residual stream is the last token's embedding, and each token of a chain has its own unit
embedding that the LM head maps to its successor. Greedy decoding then writes a fixed
text after a given prompt ending, e.g. after ``<|im_start|>assistant\\n`` (Qwen3's
generation prompt) ``<think>Hmm ok</think>Hi there<|im_end|>``. The model is real
(inferpath loads the directory as any checkpoint, runs every layer); only its weights are
chosen. The tokenizer is Llama-3's real ``tokenizer.json`` with the chat tokens of Qwen3
(``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``</think>``, ``<tool_call>``) and of
gpt-oss's harmony format added, the chat templates are the real ones of Qwen3-0.6B and
gpt-oss-120b from llama.cpp's collection.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers

from tokenizer_fixtures import llama3_dir, llama_cpp_template

QWEN_TOKENS = [("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False),
               ("</think>", False), ("<tool_call>", False), ("</tool_call>", False)]
HARMONY_TOKENS = [(t, True) for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                      "<|return|>", "<|call|>", "<|constrain|>")]
#: The answers the model writes: after Qwen3's generation prompt (thinking), after the
#: prompt of enable_thinking false (an empty think block in the prompt), after a prompt
#: that opened the think block itself, and after gpt-oss's ``<|start|>assistant``.
QWEN_CHAIN = ["\n", "<think>", "Hmm", " ok", "</think>", "Hi", " there", "<|im_end|>"]
NO_THINK_CHAIN = ["\n\n", "Hello", "<|im_end|>"]
HARMONY_CHAIN = ["assistant", "<|channel|>", "analysis", "<|message|>", "Sure", ",", "<|end|>",
                 "<|return|>"]
#: A second model (same tokenizer and template as gpt_oss) that calls a tool in harmony.
HARMONY_CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                '{"city": "Paris"}<|call|>')
HARMONY_CALL_CHAIN = ["assistant", HARMONY_CALL]
#: A template variable of the test's own (added to the real Qwen3 template): the prompt
#: opens the think block, as DeepSeek-R1's and Qwen3-thinking-2507's templates do.
OPEN_THINK = "open_think"


def _tokenizer_json(target: Path) -> int:
    """Llama-3's tokenizer.json with the added tokens; returns the vocabulary size."""
    spec = json.loads((llama3_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    next_id = max(t["id"] for t in spec["added_tokens"]) + 1
    for content, special in QWEN_TOKENS + HARMONY_TOKENS:
        spec["added_tokens"].append({"id": next_id, "content": content, "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": special})
        next_id += 1
    spec["post_processor"] = None  # no BOS: Qwen3 adds none
    target.write_text(json.dumps(spec), encoding="utf-8")
    return next_id


def _qwen3_template() -> str:
    source = llama_cpp_template("Qwen-Qwen3-0.6B.jinja")
    prompt = "{{- '<|im_start|>assistant\\n' }}"
    assert prompt in source
    return source.replace(prompt, prompt + f"\n    {{%- if {OPEN_THINK} is defined and {OPEN_THINK} %}}"
                                           "{{- '<think>' }}{%- endif %}")


def _successors(tokenizer, chains: list[list[str]]) -> dict[int, int]:
    """token id -> the id that must follow it, from chains of texts (each text's tokens in
    order); a token with two successors is an error."""
    successors: dict[int, int] = {}
    for chain in chains:
        ids = [i for text in chain for i in tokenizer.encode(text, allow_special=True, add_bos=False)]
        for a, b in zip(ids, ids[1:]):
            assert successors.get(a, b) == b, f"token {a} has two successors"
            successors[a] = b
    return successors


def _save_model(target: Path, vocab_size: int, successors: dict[int, int], eos_id: int) -> None:
    hidden = 32
    assert len(successors) <= hidden
    config = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos_id)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for k, (a, b) in enumerate(successors.items()):
            model.model.embed_tokens.weight[a, k] = 1.0  # a: the unit vector e_k
            model.lm_head.weight[b, k] = 20.0  # e_k -> a large logit for b
        for layer in model.model.layers:  # nothing is added to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(target)


def build_thinking_models(root: Path) -> dict[str, Path]:
    """Directories ``qwen3`` (Qwen3's template), ``gpt_oss`` (gpt-oss's template) of one
    tiny model, and ``gpt_oss_call`` (gpt-oss's template, a model that calls a tool);
    built once under ``root``."""
    dirs = {"qwen3": root / "qwen3", "gpt_oss": root / "gpt_oss", "gpt_oss_call": root / "gpt_oss_call"}
    if all((d / "config.json").is_file() for d in dirs.values()):
        return dirs
    root.mkdir(parents=True, exist_ok=True)
    tokenizer_json = root / "tokenizer.json"
    vocab_size = _tokenizer_json(tokenizer_json)
    from inferpath.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(tokenizer_json)

    def token_id(text: str) -> int:
        ids = tokenizer.encode(text, allow_special=True, add_bos=False)
        assert len(ids) == 1, (text, ids)
        return ids[0]

    models = {
        "base": _successors(tokenizer, [QWEN_CHAIN, NO_THINK_CHAIN, HARMONY_CHAIN]),
        "call": _successors(tokenizer, [HARMONY_CALL_CHAIN]),
    }
    for name, successors in models.items():
        _save_model(root / name, vocab_size, successors, token_id("<|im_end|>"))
    eos = {"qwen3": [token_id("<|im_end|>")], "gpt_oss": [token_id("<|return|>"), token_id("<|call|>")]}
    templates = {"qwen3": _qwen3_template(), "gpt_oss": llama_cpp_template("openai-gpt-oss-120b.jinja")}
    for name, target in dirs.items():
        family = "qwen3" if name == "qwen3" else "gpt_oss"
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(root / ("call" if name == "gpt_oss_call" else "base"), staging)
        shutil.copy(tokenizer_json, staging / "tokenizer.json")
        (staging / "chat_template.jinja").write_text(templates[family], encoding="utf-8")
        (staging / "tokenizer_config.json").write_text(json.dumps(
            {"eos_token": "<|im_end|>" if family == "qwen3" else "<|return|>"}), encoding="utf-8")
        (staging / "generation_config.json").write_text(json.dumps({"eos_token_id": eos[family]}))
        staging.rename(target)
    return dirs
