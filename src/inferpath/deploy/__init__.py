"""Replicas on Ray Serve with prefix-aware routing (the optional ``distributed`` extra).

``routing``, ``prompt_text`` and ``metrics_merge`` import no Ray; ``app`` (``build_app``),
``ingress`` and ``replica`` need ``ray[serve]``. Nothing here is imported by ``import
inferpath``.
"""
