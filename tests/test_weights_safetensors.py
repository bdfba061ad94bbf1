"""Hugging Face directories: what transformers saves, load_checkpoint gives back.

Tiny random models are built and saved offline by transformers (the reference), sharded
so that the index file is exercised; broken directories are made from them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferpath.weights import WeightsError, load_checkpoint

import transformers  # test-only reference; a hard dependency of the test extras


def save_tiny(directory: Path, arch: str = "llama", tied: bool = False,
              max_shard_size: str = "200KB") -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, tie_word_embeddings=tied, eos_token_id=2)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    model.generation_config.eos_token_id = [2, 5]
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    return model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    directory = tmp_path_factory.mktemp("llama")
    return directory, save_tiny(directory)


def test_sharded_llama_dir_round_trip(llama_dir: tuple[Path, torch.nn.Module]) -> None:
    directory, model = llama_dir
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    ckpt = load_checkpoint(directory)
    reference = model.state_dict()
    assert set(ckpt.tensors) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(ckpt.tensors[name], tensor), name
    c, hf = ckpt.config, model.config
    assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers,
            c.num_heads, c.num_kv_heads, c.head_dim) == (
        "llama", hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers,
        hf.num_attention_heads, hf.num_key_value_heads, hf.hidden_size // hf.num_attention_heads)
    assert c.rms_norm_eps == hf.rms_norm_eps and not c.tie_word_embeddings
    assert ckpt.eos_token_ids == [2, 5] and ckpt.tokenizer_path == directory


def test_dtype_is_applied(llama_dir: tuple[Path, torch.nn.Module]) -> None:
    ckpt = load_checkpoint(llama_dir[0], dtype=torch.bfloat16)
    assert {t.dtype for t in ckpt.tensors.values()} == {torch.bfloat16}


def test_qwen2_tied_single_file_has_biases_and_no_head(tmp_path: Path) -> None:
    model = save_tiny(tmp_path, arch="qwen2", tied=True, max_shard_size="50MB")
    ckpt = load_checkpoint(tmp_path / "model.safetensors")  # a file inside the dir works too
    assert ckpt.config.architecture == "qwen2" and ckpt.config.tie_word_embeddings
    assert "lm_head.weight" not in ckpt.tensors
    bias = "model.layers.1.self_attn.k_proj.bias"
    assert torch.equal(ckpt.tensors[bias], model.state_dict()[bias])


@pytest.fixture
def single_file_dir(tmp_path: Path, llama_dir: tuple[Path, torch.nn.Module]) -> Path:
    """The tiny llama as one model.safetensors, ready to be broken."""
    directory = tmp_path / "single"
    directory.mkdir()
    shutil.copy(llama_dir[0] / "config.json", directory)
    save_file({k: v.contiguous() for k, v in llama_dir[1].state_dict().items()},
              directory / "model.safetensors")
    return directory


def test_wrong_shape_names_file_tensor_and_expected(single_file_dir: Path) -> None:
    file = single_file_dir / "model.safetensors"
    tensors = load_file(file)
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 100)
    save_file(tensors, file)
    with pytest.raises(WeightsError, match=r"model\.safetensors: tensor 'model\.layers\.1\.mlp\.down_proj"
                                           r"\.weight' has shape \(64, 100\), expected \(64, 128\)"):
        load_checkpoint(single_file_dir)


def test_missing_tensor_names_it_and_its_shape(single_file_dir: Path) -> None:
    file = single_file_dir / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.0.self_attn.q_proj.weight"]
    save_file(tensors, file)
    with pytest.raises(WeightsError, match=r"missing tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' "
                                           r"\(expected shape \(64, 64\)\) in model\.safetensors"):
        load_checkpoint(single_file_dir)


def test_truncated_safetensors_is_named(single_file_dir: Path) -> None:
    file = single_file_dir / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-500])
    with pytest.raises(WeightsError, match=r"model\.safetensors: not a readable safetensors file"):
        load_checkpoint(single_file_dir)


def test_missing_shard_is_named(tmp_path: Path, llama_dir: tuple[Path, torch.nn.Module]) -> None:
    directory = tmp_path / "sharded"
    shutil.copytree(llama_dir[0], directory)
    shard = sorted(directory.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(WeightsError, match=rf"names shard {shard.name} .* not there"):
        load_checkpoint(directory)


def test_pickled_weights_are_refused(tmp_path: Path, llama_dir: tuple[Path, torch.nn.Module]) -> None:
    shutil.copy(llama_dir[0] / "config.json", tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(WeightsError, match="never unpickles"):
        load_checkpoint(tmp_path)


def test_not_a_model_and_missing_path(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(WeightsError, match="neither a GGUF file"):
        load_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(WeightsError, match="no config.json"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "absent.gguf")
