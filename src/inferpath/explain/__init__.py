"""explain: what every stage reads, writes and costs, predicted and measured.

- ``cost.pass_cost`` / ``request.estimate_request``: the per-stage cost model for any
  ModelConfig on any HardwareSpec (presets in ``hardware``, ``this-machine`` via ``probe``).
- ``seed.seed_figures``: the seed article's Llama-3-70B figures beside the exact values.
- ``trace.request_trace``: a request the engine served (engine/trace.py), each stage timed
  beside the prediction.
- ``roofline.plot_roofline``: the stages on a roofline chart.

Importing this package does not import torch; the probe and the trace do, when used.
"""

from inferpath.explain.cost import PassCost, Precision, StageCost, pass_cost
from inferpath.explain.hardware import HARDWARE_PRESETS, HardwareSpec, get_hardware
from inferpath.explain.presets import MODEL_PRESETS, resolve_model_config
from inferpath.explain.request import RequestCost, RequestSpec, estimate_request

__all__ = [
    "HARDWARE_PRESETS", "MODEL_PRESETS", "HardwareSpec", "PassCost", "Precision", "RequestCost",
    "RequestSpec", "StageCost", "estimate_request", "get_hardware", "pass_cost", "resolve_model_config",
]
