"""A traced MoE step priced at the experts its routers really chose, beside the nominal top-k.

The cost model (cost.py, layer_cost.py) reads, per MoE layer, the experts a pass's tokens
are expected to touch under uniform routing: ``E * (1 - (1 - k/E) ** tokens)`` (exactly k
for one token). A traced step knows the experts each layer's router chose
(``StepRecord.experts_touched``, engine/trace_experts.py); a real router is not uniform,
so a prompt's tokens share experts more (or less) than the formula says. Here the routed
matrices' stages (``gate_proj``, ``up_proj``, ``down_proj`` of the routed experts; shared
experts and dense layers are read whole either way) are re-priced at the bytes actually
read: each layer's distinct chosen experts times one expert's bytes in that stage (its
formats' size as run: the one-token pass's bytes over its k experts and layers), the
weights' memory time scaled by the same factor; FLOPs stay k experts a token.

Invariant: for a step whose routers chose, in every MoE layer, exactly as many distinct
experts as the expected count (a one-token decode step: k), the routed prediction equals
the nominal one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferpath.explain.cost import PassCost, pass_cost

ROUTED_STAGES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RoutedStep:
    """A step's routing and its routed price."""

    cost: PassCost  # the step's prediction with the routed stages at the experts read
    json: dict  # what the trace shows (module doc)


def expert_bytes(config, hardware, precision) -> dict[str, float]:
    """{routed stage: bytes of one expert's matrix in one layer, as run}."""
    one = pass_cost(config, hardware, precision, 1, 1, fused_attention=True)
    k = config.num_experts_per_tok
    return {s.name: s.weight_bytes / (s.count * k) for s in one.stages if s.name in ROUTED_STAGES and s.count}


def routed_step(record, config, hardware, precision, predicted: PassCost) -> RoutedStep | None:
    """The step's prediction at its routers' choices (module doc); None for a dense model
    or a step that recorded no routing."""
    touched = getattr(record, "experts_touched", None)
    if not config.is_moe or not touched:
        return None
    per_expert = expert_bytes(config, hardware, precision)
    distinct = sum(len(experts) for experts in touched.values())
    bw = hardware.memory_bandwidth
    stages, nominal_bytes, routed_bytes = [], 0.0, 0.0
    for stage in predicted.stages:
        if stage.name not in per_expert or not stage.weight_bytes:
            stages.append(stage)
            continue
        routed = per_expert[stage.name] * distinct
        factor = routed / stage.weight_bytes
        other_s = (stage.bytes_read - stage.weight_bytes + stage.bytes_written) / bw
        weights_s = max(0.0, stage.memory_time_s - other_s)
        # a one-row stage's compute time is its GEMV's (kernel_cost.price_stage): scaled alike
        compute_s = stage.compute_time_s * (factor if stage.compute_time_s <= weights_s * (1 + 1e-9) else 1.0)
        stages.append(replace(stage, weight_bytes=routed, bytes_read=stage.bytes_read - stage.weight_bytes + routed,
                              memory_time_s=other_s + weights_s * factor, compute_time_s=compute_s))
        nominal_bytes += stage.weight_bytes
        routed_bytes += routed
    num_tokens = sum(c.num_new_tokens for c in record.chunks)
    E, k = config.num_experts, config.num_experts_per_tok
    layers = [{"layer": layer, "experts": list(rows), "tokens": list(rows.values()), "distinct": len(rows)}
              for layer, rows in sorted(touched.items())]
    view = {
        "num_experts": E, "top_k": k, "num_tokens": num_tokens, "layers": layers,
        "distinct": distinct,  # over the MoE layers
        # what the cost model assumes: the expected union of k a token under uniform routing
        "expected_per_layer": E * (1.0 - (1.0 - k / E) ** num_tokens),
        "top_k_per_layer": min(E, k * num_tokens),  # k a token, none shared
        "weight_bytes_read": routed_bytes, "weight_bytes_nominal": nominal_bytes,
    }
    return RoutedStep(replace(predicted, stages=tuple(stages)), view)
