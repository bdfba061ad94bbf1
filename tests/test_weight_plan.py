"""The weight plan (engine/weight_plan.py), decided once per model, and every consumer
agreeing with it: the loaded model's matrices and norms, the KV cache, the kernels'
level (the quantized row cutoff included), explain's precision and the trace's, for each
kind of checkpoint (quantized GGUF, BF16 and F16 GGUF, float32 and bf16 safetensors,
``--quantization``, ``--dtype``, no kernels, tensor parallelism), at every forced level
this CPU runs."""

from __future__ import annotations

import pytest
import torch
from gguf_files import write_float_gguf

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.engine.weight_plan import plan_weights
from inferpath.explain.cost import Precision
from inferpath.explain.trace import precision_of
from inferpath.kernels import build, ops
from inferpath.kernels.quantized import QuantLinear
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams


@pytest.fixture(params=build.LEVEL_NAMES)
def isa(request, monkeypatch):
    level = request.param
    if not build.can_run(level):
        pytest.skip(f"this CPU cannot execute the {level} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", level)
    if build.kernel_level(torch.float32) is None:
        pytest.skip(build.kernel_status())
    return level


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> path: the packaged Q4_1 SmolLM2, it as BF16 and F16 GGUF files, and a tiny
    Llama (transformers, random weights) saved as float32 and as bf16 safetensors."""
    import gguf
    import transformers  # test-only reference

    root = tmp_path_factory.mktemp("plans")
    smollm2 = resolve_model("smollm2-135m-instruct")
    paths = {"q4_1 gguf": str(smollm2),
             "bf16 gguf": str(write_float_gguf(smollm2, root / "bf16.gguf")),
             "f16 gguf": str(write_float_gguf(smollm2, root / "f16.gguf", stored=gguf.GGMLQuantizationType.F16))}
    from inferpath.tokenizer.train import save_tokenizer_json, train_bpe

    tokenizer = train_bpe("the weight plan is decided once " * 20, 264, special_tokens=["</s>"])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=264, hidden_size=128, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    for name, dtype in (("f32 dir", torch.float32), ("bf16 dir", torch.bfloat16)):
        model.to(dtype).save_pretrained(root / name)
        save_tokenizer_json(tokenizer, root / name)
        paths[name] = str(root / name)
    return paths


def native_bf16(level: str) -> bool:
    """Whether ``auto`` runs float weights in bf16 at ``level`` (AVX512-BF16 or AMX)."""
    return level == "avx512" and bool({"avx512_bf16", "amx_bf16"} & build.cpu_flags()) \
        and build.kernel_level(torch.bfloat16) == "avx512"


def expected(kind: str, config: dict, level: str) -> tuple[str, torch.dtype, tuple[str, ...]]:
    """(matrices, activation dtype, formats run) the rules of the module doc give."""
    f32, bf16 = torch.float32, torch.bfloat16
    if config.get("quantization"):
        return "quantized", f32, ("Q8_0",)
    if config.get("dtype"):
        dtype = getattr(torch, config["dtype"])
        name = config["dtype"]
        stored = {"q4_1 gguf": None, "bf16 gguf": "bfloat16", "f16 gguf": "float16", "f32 dir": "float32",
                  "bf16 dir": "bfloat16"}[kind]
        how = "dequantized" if stored is None else ("as laid out" if stored == name else "converted")
        return how, dtype, (name,)
    if kind == "q4_1 gguf":
        if config.get("cpu_kernels") is False or config.get("tensor_parallel_size", 1) > 1:
            return "dequantized", f32, ("float32",)
        return "as laid out", f32, ("Q4_1", "Q8_0")
    act = bf16 if native_bf16(level) and config.get("cpu_kernels", True) else f32
    stored = {"bf16 gguf": "bfloat16", "f16 gguf": "float16", "f32 dir": "float32", "bf16 dir": "bfloat16"}[kind]
    if stored == "bfloat16" and act == f32 and config.get("cpu_kernels", True):
        return "widened", f32, ("bfloat16",)
    name = str(act).removeprefix("torch.")
    return ("as laid out" if stored == name else "converted"), act, (name,)


CASES = [  # (checkpoint, EngineConfig fields beyond threads)
    ("q4_1 gguf", {}), ("q4_1 gguf", {"dtype": "float32"}), ("q4_1 gguf", {"cpu_kernels": False}),
    ("bf16 gguf", {}), ("bf16 gguf", {"dtype": "bfloat16"}), ("f16 gguf", {}),
    ("f32 dir", {}), ("f32 dir", {"dtype": "bfloat16"}), ("f32 dir", {"quantization": "q8_0"}),
    ("bf16 dir", {}),
]


@pytest.mark.parametrize("kind,fields", CASES, ids=[f"{k}-{'-'.join(map(str, f.values())) or 'auto'}"
                                                    for k, f in CASES])
def test_every_consumer_agrees_with_the_plan(files, kind, fields, isa):
    config = EngineConfig(threads=1, kv_cache_memory_bytes=16 * 2**20, **fields)
    plan = plan_weights(files[kind], config)
    how, act, runs = expected(kind, fields, isa)
    assert (plan.matrices, plan.activation_dtype, plan.runs) == (how, act, runs), plan
    assert plan.kv_dtype == plan.activation_dtype
    family = "quantized" if plan.quantized else str(act).removeprefix("torch.")
    level = build.kernel_level(family) if config.cpu_kernels else None
    assert plan.kernel_level == (level or "PyTorch") and plan.kernel_family == family

    engine = LLMEngine.from_model(files[kind], config)
    assert engine.weight_plan == plan  # decided once, the same again
    model = engine.runner.model
    assert engine.kv_cache.k_caches[0].dtype == plan.kv_dtype  # the cache
    assert model.model.norm.weight.dtype == plan.activation_dtype  # the activations
    assert engine.weight_format.formats == " + ".join(plan.runs)  # the matrices as loaded
    assert engine.weight_format.dtype == plan.activation_dtype
    assert any(isinstance(m, QuantLinear) for m in model.modules()) == plan.quantized
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert (bool(linears) and all(m.weight.dtype == torch.bfloat16 for m in linears)) == (plan.runs == ("bfloat16",))
    assert precision_of(engine) == Precision.of_plan(plan)  # the trace's cost model
    if kind.endswith("gguf") and not fields:
        assert Precision.of_gguf(files[kind]) == Precision.of_plan(plan)  # explain's
    if plan.quantized and plan.kernel_level != "avx512":  # the kernels' row cutoff, at the plan's level
        limit = ops.QUANT_MATMUL_MAX_ROWS[plan.kernel_level]
        assert ops.quant_rows_fused(limit) and not ops.quant_rows_fused(limit + 1)
    native = model.model.native_decode_refusal() if hasattr(model.model, "native_decode_refusal") else "no stack"
    assert (native == "") == (plan.kernel_level != "PyTorch" and plan.activation_dtype in (torch.float32,
                                                                                            torch.bfloat16)), native


def test_the_summary_line_prints_the_plan(files):
    from inferpath.cli.generate import summary_line

    engine = LLMEngine.from_model(files["q4_1 gguf"], EngineConfig(threads=1))
    engine.add_request("0", "Hi", SamplingParams(max_tokens=2, temperature=0))
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    line = summary_line(final, engine.kv_cache.bytes_per_token, engine.weight_format, plan=engine.weight_plan)
    plan = engine.weight_plan
    # both formats repacked by 8 rows at load where that is the level's default (avx2, avx512:
    # weight_plan.py), the tied Q8_0 table with its head
    how = "Q4_1 + Q8_0 repacked by 8 rows" if plan.repacked == ("Q4_1", "Q8_0") else "Q4_1 + Q8_0 as laid out"
    assert plan.repacked in ((), ("Q4_1", "Q8_0")), plan.repacked
    assert f"{how}, float32 activations and KV, kernels {plan.kernel_level}" in line
    assert plan.describe() in line


def test_a_sharded_plan_keeps_nothing_in_place(files):
    """Tensor parallelism: blocks dequantized and bf16 matrices converted, on every rank
    (the workers load by the same plan)."""
    sharded = EngineConfig(threads=1, tensor_parallel_size=2)
    plan = plan_weights(files["q4_1 gguf"], sharded)
    assert plan.matrices == "dequantized" and not plan.keep_quantized and plan.tensor_parallel_size == 2
    plan = plan_weights(files["bf16 gguf"], sharded)
    assert not plan.keep_bf16 and plan.matrices in ("as laid out", "converted")
    assert "2 TP ranks" in plan.describe()


def test_quantizing_a_quantized_file_is_refused(files):
    from inferpath.engine.load import load_weights

    with pytest.raises(ValueError, match="quantization='q8_0' quantizes float weights.*Q4_1 \\+ Q8_0 already"):
        load_weights(files["q4_1 gguf"], EngineConfig(quantization="q8_0"))


def test_the_plan_says_how_many_passes_of_x_the_k_quants_meet():
    """The summary's note: a decode step's count and, where it differs, a prompt's (32+
    rows: one everywhere; csrc/quant/activations.h); nothing for a file without K-quants."""
    from test_quantized import kernel_levels

    from inferpath.engine.weight_plan import k_quant_passes_note

    for level in kernel_levels():
        expected = " (the K-quants' x in 1 int8 pass)" if level == "avx512" else \
            " (the K-quants' x in 2 int8 passes, prompts in 1)"
        assert k_quant_passes_note(["Q4_K", "Q6_K"], level) == expected, level
        assert k_quant_passes_note(["Q4_1", "Q8_0"], level) == "", level
