"""Shared fixtures.

Speculating engines price their steps by measured wall time (engine/spec/step_costs.py),
which would make which tokens get drafted depend on the machine's load. Every test's
engines get fixed prices instead (every step costs the same whatever its rows, as when
reading the weights bounds it; drafting free), so what is drafted is a function of the text alone; tests/test_spec_policy.py
tests the measured prices themselves on fed times.
"""

import pytest

from inferpath.engine.spec import speculator
from inferpath.engine.spec.step_costs import StepCosts


class FixedStepCosts(StepCosts):
    """Every step costs 1; drafting costs nothing; records are ignored."""

    def record(self, rows: int, seconds: float) -> None:
        pass

    def record_draft(self, num_tokens: int, seconds: float) -> None:
        pass

    def needs_sample(self, rows: int) -> bool:
        return False

    def cost(self, rows: int) -> float:
        return 1.0


@pytest.fixture(autouse=True)
def fixed_step_costs(monkeypatch):
    monkeypatch.setattr(speculator, "StepCosts", FixedStepCosts)


@pytest.fixture(autouse=True, scope="module")
def release_kept_buffers():
    """Each test module starts and ends with no kept output buffers (kernels/workspace.py):
    an engine process keeps them for its life, a test session would carry them from module
    to module."""
    from inferpath.kernels import workspace

    workspace.release()
    yield
    workspace.release()
