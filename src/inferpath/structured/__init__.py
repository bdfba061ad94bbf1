"""Structured output: grammar masks over the vocabulary (design.md: ``structured/``).

A request that asks for structured output (a JSON schema, any JSON object, a regex, one of
several strings, a Lark/GBNF grammar) carries a torch-free ``StructuredOutput`` in its
``SamplingParams``. The engine's ``GrammarCompiler`` turns it into a grammar once (cached by
spec) and gives each sequence its own ``GrammarMatcher``; each step the sampler asks the
matchers of the constrained rows for their token bitmasks and sets every disallowed logit
to -inf (``apply_bitmasks``), so constrained and free rows share one batch. The grammar
engine is ``llguidance`` (Earley parser + lexer over the tokenizer's byte-level tokens).
"""

from __future__ import annotations

from inferpath.structured.spec import GrammarError, StructuredOutput

__all__ = ["GrammarError", "StructuredOutput"]
