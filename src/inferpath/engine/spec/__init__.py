"""Speculative decoding: drafters propose tokens past each decoding sequence's last one;
the next step verifies them as one chunk of k + 1 (engine/scheduler.py) and the rejection
sampler accepts a prefix (sampling/rejection.py).

``Speculator`` decides who drafts and how many (engine/spec/speculator.py); the drafters
are ``ngram`` (engine/spec/ngram.py), ``suffix`` (engine/spec/suffix.py) and ``draft_model``
(engine/spec/draft_model.py).
"""

from inferpath.engine.spec.speculator import Speculator

__all__ = ["Speculator"]
