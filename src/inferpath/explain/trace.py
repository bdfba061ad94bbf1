"""A live trace of one request: the seed's walk-through, measured on a real model.

The request is driven directly (no engine, no scheduler), so every step is exactly one
sequence's pass: checkpoint -> model -> KV cache -> one prefill pass over the prompt ->
decode passes of one token each. Each pass is timed per stage (hooks.StageTimer) and
beside it the cost model predicts the same pass on ``this-machine`` (probe.py), at the
model's run dtype (fp32 on the CPU) with a fused attention kernel (the model calls
``scaled_dot_product_attention``, which never writes the scores to memory).

Sampling here is deliberately plain: softmax(logits / temperature), the top candidates
shown with their probabilities, then argmax (temperature 0) or a draw from a seeded
generator. A step's wall time covers the forward pass, the LM head and the draw.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from inferpath.config import ModelConfig
from inferpath.explain.cost import PassCost, Precision, pass_cost
from inferpath.explain.hardware import HardwareSpec
from inferpath.explain.hooks import StageTimer
from inferpath.model.metadata import AttentionMetadata

BLOCK_SIZE = 16


@dataclass
class Candidate:
    token_id: int
    text: str
    probability: float


@dataclass
class StepTrace:
    """One forward pass: what went in, how long each stage took, what came out."""

    index: int
    phase: str  # "prefill" or "decode"
    num_new_tokens: int
    context_len: int  # tokens in the KV cache after this pass
    step_s: float  # wall time: forward + LM head + sampling
    measured: dict[str, float]  # measured row -> seconds (see hooks.py), incl. "sampling", "other"
    predicted: PassCost
    candidates: list[Candidate]
    token_id: int
    token_text: str
    kv_bytes: int  # the cache in use after the pass

    @property
    def hooked_s(self) -> float:
        """Time inside the hooked stage modules and the timed sampling code."""
        return sum(v for k, v in self.measured.items() if k not in ("residual", "other"))


@dataclass
class TraceResult:
    model: str
    config: ModelConfig
    hardware: HardwareSpec
    prompt: str
    prompt_ids: list[int]
    prompt_pieces: list[str]
    tokenize_s: float
    load_s: float
    steps: list[StepTrace] = field(default_factory=list)
    output_text: str = ""
    finish_reason: str = "length"

    @property
    def prefill_s(self) -> float:
        return self.steps[0].step_s

    @property
    def decode_s(self) -> float:
        return sum(s.step_s for s in self.steps[1:])

    @property
    def prefill_share(self) -> float:
        return self.prefill_s / (self.prefill_s + self.decode_s)


def one_sequence_metadata(start: int, num_tokens: int, num_blocks: int) -> AttentionMetadata:
    """Metadata for one sequence whose slots are its positions (blocks 0, 1, 2, ... in order)."""
    slots = torch.arange(start, start + num_tokens, dtype=torch.int64)  # (num_tokens,)
    return AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int64),
        seq_lens=torch.tensor([start + num_tokens], dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int64).unsqueeze(0),  # (1, num_blocks)
        query_lens=[num_tokens], seq_lens_list=[start + num_tokens], block_size=BLOCK_SIZE,
    )


@dataclass
class LoadedModel:
    """A real model ready to trace: its checkpoint, the built Transformer, its tokenizer."""

    name: str
    checkpoint: object  # inferpath.weights.Checkpoint
    net: torch.nn.Module
    tokenizer: object  # inferpath.tokenizer.Tokenizer
    load_s: float
    precision: Precision = Precision("fp32")  # what runs, for the predictions


def load_for_trace(model: str) -> LoadedModel:
    """Resolve an alias or path, load the checkpoint with fp32 activations and build the
    model; a GGUF's quantized weights stay quantized where the kernels run, as the engine
    runs them, and the predictions count their bytes."""
    from inferpath.kernels.quantized import build_quantized_model, quantized_kernels_available
    from inferpath.model import build_model
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer
    from inferpath.weights import load_checkpoint

    start = time.perf_counter()
    path = resolve_model(model)
    checkpoint = load_checkpoint(path, dtype=torch.float32, keep_quantized=quantized_kernels_available())
    quantized = bool(checkpoint.quantized_tensors)
    net = build_quantized_model(checkpoint) if quantized else build_model(checkpoint, torch.float32)
    tokenizer = load_tokenizer(checkpoint.tokenizer_path)
    precision = Precision.of_gguf(path) if quantized else Precision("fp32")
    return LoadedModel(model, checkpoint, net, tokenizer, time.perf_counter() - start, precision)


def run_trace(prompt: str, model: str = "smollm2-135m-instruct", max_tokens: int = 8,
              temperature: float = 0.0, seed: int = 0, top: int = 5, chat: bool = True,
              hardware: HardwareSpec | None = None,
              progress: Callable[[str], None] | None = None) -> TraceResult:
    """Load ``model`` and trace one request (see ``trace_request``)."""
    say = progress or (lambda message: None)
    say(f"loading {model} ...")
    loaded = load_for_trace(model)
    if hardware is None:
        from inferpath.explain.probe import probe_this_machine

        say("probing this machine (cached after the first run) ...")
        hardware = probe_this_machine()
    return trace_request(loaded, prompt, hardware, max_tokens, temperature, seed, top, chat, say)


def trace_request(loaded: LoadedModel, prompt: str, hardware: HardwareSpec, max_tokens: int = 8,
                  temperature: float = 0.0, seed: int = 0, top: int = 5, chat: bool = True,
                  progress: Callable[[str], None] | None = None, timed: bool = True) -> TraceResult:
    """Generate up to ``max_tokens`` tokens for ``prompt``, timing every stage of every pass.

    ``timed=False`` runs the same loop without hooks (the reference a test compares with).
    """
    from inferpath.cache.kv import KVCache

    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    say = progress or (lambda message: None)
    net, tokenizer, checkpoint = loaded.net, loaded.tokenizer, loaded.checkpoint
    t0 = time.perf_counter()
    ids = tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat else tokenizer.encode(prompt)
    tokenize_s = time.perf_counter() - t0
    config = checkpoint.config
    limit = config.max_position_embeddings
    if len(ids) + max_tokens > limit:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                         f"model's context of {limit} tokens")
    num_blocks = math.ceil((len(ids) + max_tokens) / BLOCK_SIZE)
    cache = KVCache(config, num_blocks, BLOCK_SIZE, torch.float32)
    result = TraceResult(loaded.name, config, hardware, prompt, ids,
                         [tokenizer.decode([i]) for i in ids], tokenize_s, loaded.load_s)
    generator = torch.Generator().manual_seed(seed)
    eos = set(checkpoint.eos_token_ids) | set(tokenizer.eos_token_ids)
    new_ids: list[int] = []
    tokens, position = ids, 0
    timer = StageTimer(net) if timed else None
    with torch.inference_mode(), (timer or contextlib.nullcontext()):
        for index in range(max_tokens):
            say(f"step {index}: {len(tokens)} token(s) at position {position}")
            meta = one_sequence_metadata(position, len(tokens), num_blocks)
            input_ids = torch.tensor(tokens, dtype=torch.int64)  # (num_tokens,)
            positions = torch.arange(position, position + len(tokens), dtype=torch.int64)
            if timer:
                timer.take()  # discard anything timed outside a step
            step_start = time.perf_counter()
            hidden = net(input_ids, positions, cache, meta)  # (num_tokens, hidden_size)
            logits = net.compute_logits(hidden[-1:])[0]  # (vocab,) float32: the last position only
            sample_start = time.perf_counter()
            top_probs, top_ids, token_id = _sample(logits, temperature, top, generator)
            step_end = time.perf_counter()
            candidates = [Candidate(i, tokenizer.decode([i]), p) for i, p in zip(top_ids, top_probs, strict=True)]
            measured = timer.take() if timer else {}
            measured["sampling"] = step_end - sample_start
            timed_s = sum(measured.values())
            measured["other"] = max(0.0, (step_end - step_start) - timed_s)
            context = position + len(tokens)
            predicted = pass_cost(config, hardware, loaded.precision, len(tokens), context, fused_attention=True)
            result.steps.append(StepTrace(
                index, "prefill" if index == 0 else "decode", len(tokens), context,
                step_end - step_start, measured, predicted, candidates, token_id,
                tokenizer.decode([token_id]), cache.bytes_per_token * context,
            ))
            new_ids.append(token_id)
            if token_id in eos:
                result.finish_reason = "stop"
                break
            tokens, position = [token_id], context
    result.output_text = tokenizer.decode(new_ids, skip_special_tokens=True)
    return result


def _sample(logits: torch.Tensor, temperature: float, top: int,
            generator: torch.Generator) -> tuple[list[float], list[int], int]:
    """Top candidates' probabilities and ids (at this temperature; at 0, at 1.0) and the drawn id."""
    probs = torch.softmax(logits / (temperature or 1.0), dim=-1)  # (vocab,)
    top_probs, top_ids = torch.topk(probs, top)
    if temperature == 0:
        token_id = int(torch.argmax(logits))
    else:
        token_id = int(torch.multinomial(probs, 1, generator=generator))
    return top_probs.tolist(), top_ids.tolist(), token_id
