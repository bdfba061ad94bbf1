"""The native decode step's watch over its layer modules remembers the stage clock's
wrappers it passed, and never a wrapper that replaced one of them."""

from __future__ import annotations

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.kernels.decode_stack import NATIVE_TIMED
from inferpath.models import resolve_model


def test_a_remembered_pass_does_not_cover_a_wrapper_put_over_a_timed_one():
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"), EngineConfig(threads=1))
    stack = engine.runner.model.model
    plan = stack._native_plan()
    mlp = stack.layers[2].mlp

    def module_path_timer(*args):  # a stage clock's wrapper: it times the module path only
        return type(mlp).forward(mlp, *args)
    setattr(module_path_timer, NATIVE_TIMED, True)
    mlp.forward = module_path_timer
    assert not plan.watched() and not plan.watched()  # the second from the remembered pass

    def outer(*args):  # someone else's wrapper over the timer (a profiler, a hook library)
        return module_path_timer(*args)
    mlp.forward = outer
    assert plan.watched()
    mlp.forward = module_path_timer
    assert not plan.watched()
    stack.layers[5].self_attn.forward = stack.layers[5].self_attn.forward  # a new unmarked one elsewhere
    assert plan.watched()
    del stack.layers[5].self_attn.forward, mlp.forward
    assert not plan.watched()
