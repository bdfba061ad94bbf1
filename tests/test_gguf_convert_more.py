"""SmolLM3, ERNIE 4.5, GLM-4 MoE, DeepSeek-V3 (``deepseek2``) and Qwen3-Next (``qwen3next``)
GGUF files made by llama.cpp's own converter, loaded by inferpath: logits as transformers'.

As test_gguf_convert.py: a tiny random model per family is saved by transformers with a
real tokenizer, converted by ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36) to F32,
F16 and Q8_0 once per session, and loaded from the file; over a prompt of 12 tokens
(prefilled in chunks of 5 and 7) and 8 greedy decode steps our logits are compared with
transformers' on the directory, its weights rounded as the converter stores them in that
format: within 1e-4 of the largest logit (and Q8_0 read in place by the kernels: 1e-3). What the file does not say follows llama.cpp's
loaders: SmolLM3 skips RoPE on every 4th layer (so the model here has 4 layers, the 4th
without RoPE). Per family, what the converter needs beyond test_gguf_convert.py's models:

- GLM-4 MoE: its vocabulary writer looks up GLM's special tokens (``[gMASK]``,
  ``<|user|>``, ``<|endoftext|>``, ``<|observation|>``), so four of Llama-3's reserved
  tokens are renamed to them (the converter's tokenizer hash does not change);
- DeepSeek-V3: ``scoring_func: sigmoid`` in config.json, as DeepSeek-V3's own, or the file
  has no ``expert_gating_func`` and llama.cpp runs it with softmax scores (refused, tested);
- Qwen3-Next: ``--no-mtp`` (the converter asserts on a model without its MTP layers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gguf_convert import LLAMA3_VOCAB_SIZE, SPM_VOCAB_SIZE, rounded_as_converted, save_tiny
from test_gguf_convert import BPE, FORMATS, IN_PLACE_TOLERANCE, SPM, TOLERANCE, _tiny
from test_hybrid import StateRunner
from test_model import NUM_DECODE_STEPS, PagedRunner, rel_err
from tokenizer_fixtures import llama_cpp_converter_dir

from inferpath.kernels import accelerate
from inferpath.kernels.quantized import build_quantized_model
from inferpath.model import build_model
from inferpath.weights import WeightsError, load_checkpoint

import transformers  # test-only reference

# family -> (config, tokenizer, converter arguments beyond the format)
FAMILIES = {
    "smollm3": (lambda: _tiny(transformers.SmolLM3Config, LLAMA3_VOCAB_SIZE, num_hidden_layers=4,
                              no_rope_layer_interval=4, **BPE), "llama3", ()),
    "ernie4_5": (lambda: _tiny(transformers.Ernie4_5Config, SPM_VOCAB_SIZE, head_dim=32, use_bias=True, **SPM),
                 "spm", ()),
    "glm4moe": (lambda: _tiny(transformers.Glm4MoeConfig, LLAMA3_VOCAB_SIZE, num_hidden_layers=3, head_dim=32,
                              moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                              topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True,
                              attention_bias=True, **BPE), "llama3", ()),
    "deepseek2": (lambda: _tiny(transformers.DeepseekV3Config, LLAMA3_VOCAB_SIZE, intermediate_size=96,
                                moe_intermediate_size=32, num_hidden_layers=3, num_key_value_heads=4,
                                n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                topk_group=2, first_k_dense_replace=1, kv_lora_rank=20, q_lora_rank=24,
                                qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, routed_scaling_factor=2.5,
                                scoring_func="sigmoid", **BPE), "llama3", ()),
    "qwen3next": (lambda: _tiny(transformers.Qwen3NextConfig, LLAMA3_VOCAB_SIZE, intermediate_size=96,
                                num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                                linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4,
                                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                shared_expert_intermediate_size=40, **BPE), "llama3", ("--no-mtp",)),
}
GLM_SPECIAL = {128_010: "[gMASK]", 128_011: "<|user|>", 128_012: "<|endoftext|>", 128_013: "<|observation|>"}

# runs in the subprocess: each job as ``convert_hf_to_gguf.py DIR --outtype T --outfile F ARGS``
_DRIVER = """
import json, runpy, sys, traceback
converter, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, converter)
for directory, outtype, outfile, extra in jobs:
    sys.argv = ["convert_hf_to_gguf.py", directory, "--outtype", outtype, "--outfile", outfile, *extra]
    try:
        runpy.run_path(converter + "/convert_hf_to_gguf.py", run_name="__main__")
    except BaseException as exc:
        open(outfile + ".error", "w").write("".join(traceback.format_exception(exc))[-4000:])
"""


def convert_with_args(jobs: list[tuple[Path, str, Path, tuple[str, ...]]]) -> None:
    """llama.cpp's converter on every (directory, outtype, outfile, extra arguments), in one
    subprocess; a failed conversion leaves ``<outfile>.error``."""
    encoded = json.dumps([(str(d), t, str(f), list(extra)) for d, t, f, extra in jobs])
    result = subprocess.run([sys.executable, "-c", _DRIVER, str(llama_cpp_converter_dir()), encoded],
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {result.returncode}):\n{result.stderr[-6000:]}")


def _rename_glm_special_tokens(directory: Path) -> None:
    path = directory / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    for token in tokenizer["added_tokens"]:
        token["content"] = GLM_SPECIAL.get(token["id"], token["content"])
    path.write_text(json.dumps(tokenizer), encoding="utf-8")


def _perturb(model: torch.nn.Module) -> None:
    """Make the parts that are zero or constant at init count: DeepSeek's and GLM's
    selection bias, Qwen3-Next's zero-centred norms (save_tiny perturbs "norm.weight" only)."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.2)
            elif name.endswith(("dt_bias", "A_log")):
                tensor.add_(0.1 * torch.randn_like(tensor))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict[str, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("llama-cpp-converted-more")
    models, jobs = {}, []
    for family, (make_config, tokenizer, extra) in FAMILIES.items():
        directory = root / family
        model = save_tiny(make_config(), directory, tokenizer)
        _perturb(model)
        model.save_pretrained(directory)
        if family == "glm4moe":
            _rename_glm_special_tokens(directory)
        models[family] = model
        jobs += [(directory, fmt, root / f"{family}-{fmt}.gguf", extra) for fmt in FORMATS]
    # DeepSeek-V3 without scoring_func: the file llama.cpp would run with softmax scores
    config = FAMILIES["deepseek2"][0]().to_dict()
    config.pop("scoring_func")
    save_tiny(transformers.DeepseekV3Config(**config), root / "deepseek2-softmax", "llama3")
    jobs.append((root / "deepseek2-softmax", "f32", root / "deepseek2-softmax-f32.gguf", ()))
    # DeepSeek-V3 with its YaRN (a scaled mscale, so that the softmax scale it adds shows)
    config = FAMILIES["deepseek2"][0]().to_dict()
    config["max_position_embeddings"] = 128
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32, "mscale": 0.707,
                                 "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0}
    directory = root / "deepseek2-yarn"
    model = save_tiny(transformers.DeepseekV3Config(**config), directory, "llama3")
    _perturb(model)
    model.save_pretrained(directory)
    models["deepseek2-yarn"] = model
    jobs.append((directory, "f32", root / "deepseek2-yarn-f32.gguf", ()))
    convert_with_args(jobs)
    return root, models


@torch.no_grad()
def _rounded(model: torch.nn.Module, fmt: str) -> torch.nn.Module:
    """gguf_convert.rounded_as_converted, with the convolution of the Gated DeltaNet layers
    kept float32 as the converter keeps ``ssm_conv1d`` in every format."""
    rounded = rounded_as_converted(model, fmt)
    originals = dict(model.named_parameters())
    for name, param in rounded.named_parameters():
        if name.endswith("linear_attn.conv1d.weight"):
            param.copy_(originals[name])
    return rounded


def _compare(reference: torch.nn.Module, ours: torch.nn.Module, vocab_size: int, tolerance: float = TOLERANCE) -> float:
    """Worst relative logit error over a chunked prefill and NUM_DECODE_STEPS greedy steps
    (Qwen3-Next's linear layers run with a state slot: test_hybrid's runner)."""
    prompt = torch.randint(0, vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = reference(torch.tensor([prompt]), use_cache=True)
    hybrid = ours.config.num_linear_layers > 0
    runner = StateRunner(ours) if hybrid else PagedRunner(ours)
    step = (lambda tokens: runner.step([(0, tokens)])[0])
    worst = rel_err(step(prompt[:5]), ref.logits[0, 4])
    worst = max(worst, rel_err(step(prompt[5:]), ref.logits[0, -1]))
    cache = ref.cache
    for _ in range(NUM_DECODE_STEPS):
        token = int(ref.logits[0, -1].argmax())
        ref = reference(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = ref.cache
        worst = max(worst, rel_err(step([token]), ref.logits[0, -1]))
    print(f"relative logit error {worst:.2e}", end=" ")
    assert worst <= tolerance, f"relative logit error {worst:.2e} > {tolerance:.0e}"
    return worst


def _converted_file(root: Path, family: str, fmt: str) -> Path:
    path = root / f"{family}-{fmt}.gguf"
    if (error := Path(f"{path}.error")).is_file():
        pytest.fail(f"llama.cpp's converter failed on {family} ({fmt}):\n{error.read_text()}")
    return path


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_gguf_logits_match_transformers(converted, family, fmt) -> None:
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, family, fmt))
    reference = _rounded(models[family], fmt)
    assert checkpoint.config.vocab_size == reference.config.vocab_size
    _compare(reference, build_model(checkpoint), reference.config.vocab_size)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_converted_q8_0_runs_in_place_with_the_kernels(converted, family) -> None:
    """Q8_0 as the engine runs it: blocks read in place by the native kernels (their own
    summation order: within 1e-3), the tensors the loader rebuilds (MLA's kv_b_proj, the
    Gated DeltaNet's in_proj_qkvz) dequantized."""
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, family, "q8_0"), keep_quantized=True)
    assert checkpoint.quantized_tensors
    model = build_quantized_model(checkpoint, torch.float32)
    accelerate(model)
    reference = _rounded(models[family], "q8_0")
    _compare(reference, model.eval(), reference.config.vocab_size, IN_PLACE_TOLERANCE)


def test_deepseek2_file_without_sigmoid_gating_is_refused_by_name(converted) -> None:
    root, _ = converted
    with pytest.raises(WeightsError, match="expert_gating_func absent"):
        load_checkpoint(_converted_file(root, "deepseek2-softmax", "f32"))


@torch.inference_mode()
def test_deepseek2_yarn_from_the_file_matches_transformers(converted) -> None:
    """YaRN as the converter writes it (type, factor, original context, betas, and 0.1 x
    mscale_all_dim as yarn_log_multiplier) gives the checkpoint's RoPE and softmax scale."""
    root, models = converted
    checkpoint = load_checkpoint(_converted_file(root, "deepseek2-yarn", "f32"))
    scaling = dict(checkpoint.config.rope_scaling)
    assert scaling["rope_type"] == "yarn" and scaling["factor"] == 4.0
    assert abs(scaling["mscale_all_dim"] - 0.707) < 1e-6
    reference = _rounded(models["deepseek2-yarn"], "f32")
    _compare(reference, build_model(checkpoint), reference.config.vocab_size)
