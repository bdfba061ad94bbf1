"""A request's trace as the seed tells it: the engine's measured steps beside the cost model.

The measurements come from the engine that served the request (engine/trace.py: the
scheduler's batch, the runner, the model with its kernels and fused projections, the
sampler); this module runs nothing. It joins each recorded step with the cost model's
prediction of that same step on ``hardware`` and turns it into one JSON-able dict that
``inferpath trace`` prints and the web page draws.

A step's prediction covers the whole batch the step ran, as the measurement does:
``step_cost`` adds the cost of each chunk (one ``pass_cost`` per sequence) and counts the
weights once, since every sequence of a step shares one read of them. A row's predicted
figures are the sums of the cost-model stages it covers (engine/trace_stages.py
``COVERS``, with each family's stages placed by ``family_covers``); its bound is that of
its longest stage. Matmuls are priced at their own kernels' rates in the formats the
loaded model runs (explain/kernel_cost.py, ``precision_of``); a step that ran module by
module (not the native decode call: ``StepRecord.native_decode``) adds the probe's cost of
one module call per instance of each row (``calls_s``). An MoE step also gives the experts
its routers chose (``experts``) and the rows holding the routed experts their prediction at
the experts actually read (``routed_predicted_s``, explain/routed_experts.py) beside the
nominal one.
"""

from __future__ import annotations

from dataclasses import replace

from inferpath.config import ModelConfig
from inferpath.engine.trace_stages import COVERS, ROW_ORDER
from inferpath.explain.cost import PassCost, Precision, StageCost, pass_cost
from inferpath.explain.hardware import HardwareSpec
from inferpath.explain.routed_experts import ROUTED_STAGES, routed_step
from inferpath.explain.attention_cost import engine_attention_key
from inferpath.explain.sampler_cost import step_sampler_key

_PER_TOKEN_WEIGHTS = ("embedding",)  # rows of the table read per token, not once per step
_SAMPLED_ONLY = ("lm_head", "sampling")
# rows a native decode step still runs as module calls, around the call (kernels/decode_stack.py);
# the sampler's own Python is in its measured price (sampler_cost.py), not a module call
AROUND_NATIVE = ("embedding", "final_norm", "lm_head")


def step_cost(config: ModelConfig, hardware: HardwareSpec, precision: Precision,
              chunks: list[tuple[int, int, bool]], native: bool = False, sampler: str | None = None,
              attention: str | None = None) -> PassCost:
    """Cost of one engine step of ``chunks`` = [(num_new_tokens, context_len, samples)].

    One chunk alone is exactly ``pass_cost``; several share one read of the weights.
    ``native``: the step's layers ran in the native decode call (their matmuls at its rates:
    kernel_cost.py); ``sampler``: the key of its sampled rows, whose ``sampling`` stage is
    priced at the sampler's measured cost where ``hardware`` has it (sampler_cost.py);
    ``attention``: the key of its paged decode attention calls, a step of decode rows only
    priced at the kernel's measured fixed and per-token costs where ``hardware`` has it
    (attention_cost.py).
    """
    import torch

    from inferpath.explain.attention_cost import price_attention
    from inferpath.explain.kernel_cost import hot_bytes, price_stages, stays_in_cache
    from inferpath.explain.sampler_cost import price_sampling

    passes = [(pass_cost(config, hardware, precision, n, ctx, fused_attention=True, by_kernel=False), samples)
              for n, ctx, samples in chunks]
    peak, bw = hardware.flops_for(precision.compute_dtype), hardware.memory_bandwidth
    merged: dict[str, list[StageCost]] = {}
    for p, samples in passes:
        for stage in p.stages:
            if stage.name in _SAMPLED_ONLY and not samples:
                continue
            merged.setdefault(stage.name, []).append(stage)
    stages = []
    for name, parts in merged.items():
        first = parts[0]
        if len(parts) == 1:
            stages.append(first)
            continue
        weights = (sum(s.weight_bytes for s in parts) if name in _PER_TOKEN_WEIGHTS
                   else max(s.weight_bytes for s in parts))
        read = sum(s.bytes_read - s.weight_bytes for s in parts) + weights
        written = sum(s.bytes_written for s in parts)
        flops = sum(s.flops for s in parts)
        stages.append(replace(first, weight_bytes=weights, bytes_read=read, bytes_written=written,
                              flops=flops, compute_time_s=flops / peak if first.on_accelerator else 0.0,
                              memory_time_s=(read + written) / bw if first.on_accelerator else 0.0))
    first = passes[0][0]
    phase = "prefill" if any(p.phase == "prefill" for p, _ in passes) else "decode"
    priced = price_stages(tuple(stages), precision, hardware, native)
    cold = not stays_in_cache(hardware, hot_bytes(priced))  # the sampler runs after the step's bytes passed
    if all(n == 1 for n, _, _ in chunks):  # decode rows only: the paged decode kernel's own cost
        priced = price_attention(priced, attention, [ctx for _, ctx, _ in chunks], config.num_layers,
                                 config.num_heads * config.head_dim, config.sliding_window, hardware, cold, native,
                                 torch.get_num_threads())
    return PassCost(phase=phase, batch=len(chunks), num_new_tokens=sum(n for n, _, _ in chunks),
                    context_len=max(ctx for _, ctx, _ in chunks),
                    stages=tuple(price_sampling(s, sampler, hardware, cold) if s.name == "sampling" else s
                                 for s in priced),
                    weight_bytes_per_param=first.weight_bytes_per_param)


_MOE = ("router", "gate_proj", "up_proj", "silu_mul", "down_proj",
        "shared_gate_proj", "shared_up_proj", "shared_silu_mul", "shared_down_proj")


def family_covers(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """engine/trace_stages.py ``COVERS``, with each family's stages (explain/layer_cost.py)
    put in the row whose clock holds their time: QK norms and the output gate inside
    ``self_attn`` (qkv_proj), sinks in the attention kernel, the norm after attention in
    ``post_attention_layernorm`` (rmsnorm_ffn), untimed norms and Granite's scales in the
    layer (residual), an MoE under ``mlp`` (gate_up_silu) or ``block_sparse_moe``
    (moe_ffn) with its shared experts, the dense layers of an MoE model as dense_*."""
    covers = {row: tuple(stages) for row, stages in COVERS.items()}
    covers["qkv_proj"] += ("qk_norm", "attn_gate")
    covers["attention"] += ("attn_sinks",)
    covers["embedding"] += ("embedding_scale",)
    covers["lm_head"] += ("logit_scale", "logit_softcap")
    covers["residual"] += ("residual_scale", "post_ffn_norm")
    if config.sandwich_norms or config.post_norms:  # post_attention_layernorm norms attention's output
        covers["rmsnorm_ffn"] = ("post_attn_norm",)
        covers["residual"] += ("rmsnorm_ffn",) if config.sandwich_norms else ()  # Gemma's pre-FFN norm
    if config.is_moe:
        from inferpath.config import ROUTED_MOE_ARCHITECTURES

        covers["moe_ffn"] = _MOE
        under_mlp = config.architecture in (*ROUTED_MOE_ARCHITECTURES, "deepseek_v3", "qwen3_next")
        covers["gate_up_silu"] = ("dense_gate_proj", "dense_up_proj", "dense_silu_mul") + (_MOE if under_mlp else ())
        covers["down_proj"] = ("dense_down_proj",)
    return covers


def row_prediction(row: str, predicted: PassCost, module_call_s: float = 0.0,
                   covers: dict[str, tuple[str, ...]] | None = None) -> dict:
    """Predicted seconds, bytes moved (read + written) and read, FLOPs, intensity (FLOPs per
    byte moved) and bound of one measured row. ``module_call_s``: what one module call costs
    beyond its kernel (a step on the module path: HardwareSpec.module_call_s), added once per
    instance of the row (per layer, or once) as ``calls_s``; ``kernel_s`` is the rest."""
    stages = [s for s in predicted.stages if s.name in (covers or COVERS)[row]]
    if not stages:
        return {"predicted_s": None, "kernel_s": None, "calls_s": None, "bytes": None, "bytes_read": None,
                "flops": None, "intensity": None, "bound": ""}
    moved = sum(s.bytes_moved for s in stages)
    flops = sum(s.flops for s in stages)
    kernel_s = sum(s.time_s for s in stages)
    calls_s = module_call_s * max(s.count for s in stages)
    return {"predicted_s": kernel_s + calls_s, "kernel_s": kernel_s, "calls_s": calls_s, "bytes": moved,
            "bytes_read": sum(s.bytes_read for s in stages), "flops": flops,
            "intensity": flops / moved if moved else 0.0,
            "bound": max(stages, key=lambda s: s.time_s).bound}


def module_call_cost(row: str, native: bool, hardware: HardwareSpec) -> float:
    """What one instance of ``row`` pays beyond its kernel for being a module call: the
    probe's ``module_call_s`` on the module path; on the native path only for the rows run
    around the call (``AROUND_NATIVE``); none for the sampler (its probe is of the call itself)."""
    if row == "sampling" or (native and row not in AROUND_NATIVE):
        return 0.0
    return hardware.module_call_s


def precision_of(engine) -> Precision:
    """The cost model's precision of what the engine runs: its weight plan's
    (``Precision.of_plan``); for an engine over a model built by hand (no plan), its
    compute dtype and the bytes per weight of its matrices (engine.weight_format)."""
    from inferpath.explain.stage_formats import formats_of_model

    formats = formats_of_model(engine.runner.model, engine.model_config)
    if engine.weight_plan is not None:
        return Precision.of_plan(engine.weight_plan).with_formats(formats)
    weights = engine.weight_format
    dtype = str(weights.dtype).removeprefix("torch.")
    base = Precision.parse(dtype)
    bytes_per_weight = weights.weight_bytes / weights.num_weights if weights.num_weights else base.weight_bytes
    if not weights.quantized and bytes_per_weight == base.weight_bytes:
        return base.with_formats(formats)
    return Precision(base.weights, bytes_per_weight, weights.formats, formats)


def machine_for(engine, refresh: bool = False, measure: bool = True) -> HardwareSpec:
    """``this-machine`` as the engine's trace is priced on it: the probe, with the GEMV rate of
    every call shape the engine's matmuls run (measured once per shape, then cached:
    explain/probe_kernels.py; ``measure=False``: the cached ones only, the other shapes at
    their format's rate). ``refresh`` measures both again."""
    from inferpath.explain.kernel_cost import gemv_shapes
    from inferpath.explain.probe import probe_this_machine
    from inferpath.explain.probe_kernels import with_gemv_shapes
    from inferpath.explain.sampler_cost import probed_keys, sampler_key, with_sampler_costs
    from inferpath.explain import attention_cost

    shapes = gemv_shapes(precision_of(engine), native=native_decodes(engine))
    hardware = with_gemv_shapes(probe_this_machine(refresh=refresh), shapes, refresh, measure=measure)
    hardware = attention_cost.with_attention_costs(
        hardware, attention_cost.probed_keys(attention_cost.engine_attention_key(engine)), refresh, measure=measure)
    # the sampler of one greedy row (a chat's default here), and of one default sampled row
    vocab = engine.model_config.vocab_size
    return with_sampler_costs(hardware, probed_keys([sampler_key(vocab, ["greedy"]), sampler_key(vocab, ["sample"])]),
                              refresh, measure=measure)


def native_decodes(engine) -> bool:
    """Whether the engine's decode steps can take the native decode call (kernels/decode_stack.py)."""
    stack = getattr(engine.runner.model, "model", None)
    refusal = getattr(stack, "native_decode_refusal", None)
    return refusal is not None and getattr(stack, "use_native_decode", False) and not refusal()


def request_trace(tracer, request_id: str, engine, hardware: HardwareSpec) -> dict:
    """One request's recorded steps with predictions (the JSON of the CLI and the page).

    ``tracer`` is the engine's StepTracer; ``request_id`` the engine request id.
    """
    config: ModelConfig = engine.model_config
    tokenizer = engine.tokenizer
    precision = precision_of(engine)
    kv_bytes_per_token = engine.kv_cache.bytes_per_token
    records = tracer.steps_of(request_id)
    covers = family_covers(config)
    attention = engine_attention_key(engine)
    steps = []
    for record in records:
        mine = record.chunk_of(request_id)
        # the trace says whether the step's layers ran in the native decode call (its own
        # clock) or module by module (engine/trace.py StepRecord.native_decode)
        native = bool(getattr(record, "native_decode", False))
        predicted = step_cost(config, hardware, precision,
                              [(c.num_new_tokens, c.context_len, c.token_id is not None) for c in record.chunks],
                              native, step_sampler_key(record, engine), attention)
        # an MoE step: priced again at the experts its routers chose (explain/routed_experts.py)
        routed = routed_step(record, config, hardware, precision, predicted)
        rows = []
        for row in ROW_ORDER:
            if row not in record.stages:
                continue
            call_s = module_call_cost(row, native, hardware)
            rows.append({"stage": row, "measured_s": record.stages[row],
                         "covers": [n for n in covers[row] if any(s.name == n for s in predicted.stages)],
                         "note": tracer.fusions.get(row, ""), **row_prediction(row, predicted, call_s, covers)})
            if routed is not None and set(rows[-1]["covers"]) & set(ROUTED_STAGES):
                rows[-1]["routed_predicted_s"] = row_prediction(row, routed.cost, call_s, covers)["predicted_s"]
        token = None
        if mine.token_id is not None:
            token = {"id": mine.token_id, "text": tokenizer.decode([mine.token_id]),
                     "top": [{"id": i, "text": tokenizer.decode([i]), "probability": p}
                             for i, p in zip(mine.top_ids, mine.top_probs)]}
        steps.append({
            "index": record.index, "phase": "prefill" if mine.is_prefill else "decode",
            "path": "native" if native else "module",
            "step_s": record.step_s, "predicted_s": predicted.time_s + sum(r["calls_s"] or 0.0 for r in rows),
            "num_seqs": record.num_seqs, "num_prefill_tokens": record.num_prefill_tokens,
            "num_decode_tokens": record.num_decode_tokens,
            "num_new_tokens": mine.num_new_tokens, "context_len": mine.context_len,
            "kv_bytes": mine.context_len * kv_bytes_per_token,
            "num_kv_blocks_used": record.num_kv_blocks_used, "num_kv_blocks_total": record.num_kv_blocks_total,
            "flops": predicted.flops, "bytes": predicted.bytes_moved, "intensity": predicted.intensity,
            "bound": predicted.bound, "token": token, "stages": rows,
            "experts": None if routed is None else routed.json,
        })
    prefill_s = sum(s["step_s"] for s in steps if s["phase"] == "prefill")
    decode_s = sum(s["step_s"] for s in steps if s["phase"] == "decode")
    total = prefill_s + decode_s
    return {
        "request_id": request_id, "model": engine.model_name,
        "config": {"num_layers": config.num_layers, "hidden_size": config.hidden_size,
                   "num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads,
                   "vocab_size": config.vocab_size},
        "dtype": engine.engine_config.dtype, "precision": precision.description,
        "weight_plan": engine.weight_plan.describe() if engine.weight_plan is not None else None,
        "hardware": hardware_json(hardware, precision),
        "probe_stale": probe_staleness(steps, engine.weight_format.decode_bytes, hardware),
        "fusions": dict(tracer.fusions),
        "num_prompt_tokens": records[0].chunk_of(request_id).num_prompt_tokens if records else 0,
        "prefill_s": prefill_s, "decode_s": decode_s,
        "decode_path": _paths(steps, "decode"), "prefill_path": _paths(steps, "prefill"),
        "prefill_share": prefill_s / total if total else 0.0,
        "summary": summary_rows(steps),
        "steps": steps,
    }


def _paths(steps: list[dict], phase: str) -> str:
    """"native", "module", "native + module" (some of each) or "" (no such step)."""
    return " + ".join(sorted({s["path"] for s in steps if s["phase"] == phase}, reverse=True))


def probe_staleness(steps: list[dict], decode_bytes: int, hardware: HardwareSpec) -> dict | None:
    """None, or — where a decode step read its weight bytes faster than ``hardware``'s
    bandwidth allows, so the floor it is quoted against is wrong — the fastest such rate
    beside the probed one (the page says so; the server tells the probe, probe_guard.py)."""
    rates = [decode_bytes / s["step_s"] for s in steps if s["phase"] == "decode" and s["step_s"] > 0]
    fastest = max(rates, default=0.0)
    if fastest <= hardware.memory_bandwidth:
        return None
    return {"attained_read_bandwidth": fastest, "probed_read_bandwidth": hardware.memory_bandwidth}


def summary_rows(steps: list[dict]) -> list[dict]:
    """Per row: measured and predicted seconds, intensity and bound over the request's
    prefill steps and over its decode steps; bytes read and FLOPs over all its steps."""
    out = []
    for row in ROW_ORDER:
        cells = [r for s in steps for r in s["stages"] if r["stage"] == row]
        if not cells:
            continue
        entry = {"stage": row, "covers": cells[0]["covers"], "note": cells[0]["note"]}
        for phase in ("prefill", "decode"):
            mine = [r for s in steps if s["phase"] == phase for r in s["stages"] if r["stage"] == row]
            predicted = [c for c in mine if c["predicted_s"] is not None]
            entry[f"{phase}_measured_s"] = sum(c["measured_s"] for c in mine)
            entry[f"{phase}_predicted_s"] = sum(c["predicted_s"] for c in predicted) if predicted else None
            entry[f"{phase}_calls_s"] = sum(c["calls_s"] for c in predicted) if predicted else None
            entry[f"{phase}_ratio"] = (entry[f"{phase}_measured_s"] / entry[f"{phase}_predicted_s"]
                                       if predicted and entry[f"{phase}_predicted_s"] else None)
            moved, flops = sum(c["bytes"] for c in predicted), sum(c["flops"] for c in predicted)
            entry[f"{phase}_flops"] = flops if predicted else None
            entry[f"{phase}_intensity"] = flops / moved if moved else None
            entry[f"{phase}_bound"] = predicted[-1]["bound"] if predicted else ""
        predicted = [c for c in cells if c["predicted_s"] is not None]
        entry["bytes_read"] = sum(c["bytes_read"] for c in predicted) if predicted else None
        entry["flops"] = sum(c["flops"] for c in predicted) if predicted else None
        out.append(entry)
    return out


def hardware_json(hardware: HardwareSpec, precision: Precision) -> dict:
    dtype = precision.compute_dtype
    return {"name": hardware.name, "source": hardware.source, "module_call_s": hardware.module_call_s,
            "memory_bandwidth": hardware.memory_bandwidth, "peak_flops": hardware.flops_for(dtype),
            "compute_dtype": dtype, "ridge": hardware.ridge_point(dtype)}
