"""GrammarCompiler: specs to llguidance grammars, once per spec; a matcher per sequence.

Built once per engine from its tokenizer: llguidance needs every token's exact bytes
(``Tokenizer.token_bytes``; special tokens are known to it by id, so a grammar never emits
them by accident) and the model's EOS ids (allowed only where the grammar may end). Model
vocabularies padded past the tokenizer's (Qwen2.5: 151,936 rows, fewer tokens) are masked
off: those ids have no bytes.

Compiled grammars are cached by spec (``StructuredOutput`` without its ``param``), so the
first request with a schema pays its compilation (~1 ms for typical schemas) and later ones
only build a matcher from the cached grammar.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from inferpath.structured.matcher import ClosingHints, GrammarMatcher
from inferpath.structured.schema import close_objects
from inferpath.structured.spec import GrammarError, StructuredOutput

#: JSON is generated compactly ({"a":1}, no free whitespace), as OpenAI's is: a model free
#: to choose whitespace can emit newlines until max_tokens, and on SmolLM2-135M the
#: compact form kept 20/20 extraction answers valid where indented JSON ran on in 3.
JSON_OPTIONS = {"whitespace_flexible": False}
#: Compiled grammars kept (least recently used evicted first).
MAX_CACHED_GRAMMARS = 256


class _TokenizerView:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer: tokens as bytes, EOS,
    BOS, special ids, and a bytes -> ids encoder."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int) -> None:
        num_tokens = min(tokenizer.vocab_size, vocab_size)
        self.tokens = [tokenizer.token_bytes(i) for i in range(num_tokens)]
        self.tokens += [b""] * (vocab_size - num_tokens)  # padding rows: never allowed
        self.eos_token_id = eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode_ordinary(text.decode("utf-8", errors="replace"))


class GrammarCompiler:
    """Compiles ``StructuredOutput`` specs for one tokenizer; thread-safe (the server adds
    requests from its event loop while the engine steps in a worker thread)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int] | set[int]) -> None:
        if not eos_token_ids:
            raise ValueError("structured output needs the model's EOS token ids (none known)")
        eos = sorted(eos_token_ids)
        view = _TokenizerView(tokenizer, vocab_size, eos[0])
        self.vocab_size = vocab_size
        self.closing_hints = ClosingHints(view.tokens, [*view.special_token_ids, *eos])
        self.ll_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(view),
                                                   n_vocab=vocab_size, eos_token=eos)
        self._cache: OrderedDict[StructuredOutput, str] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutput) -> str:
        """The llguidance grammar of ``spec`` (validated); GrammarError naming the problem."""
        with self._lock:
            grammar = self._cache.get(spec)
            if grammar is not None:
                self._cache.move_to_end(spec)
                return grammar
        grammar = self._build(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.ll_tokenizer)
        if is_error:
            raise GrammarError(f"cannot compile the {_describe(spec)}: {messages[0]}", spec.param)
        with self._lock:
            self._cache[spec] = grammar
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return grammar

    def new_matcher(self, spec: StructuredOutput) -> GrammarMatcher:
        """A fresh matcher (start state) for one sequence."""
        grammar = self.compile(spec)
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"cannot compile the {_describe(spec)}: {matcher.get_error()}",
                               spec.param)
        return GrammarMatcher(matcher, self.vocab_size, self.closing_hints,
                              json_bounds=spec.kind in ("json_schema", "json_object"))

    @staticmethod
    def _build(spec: StructuredOutput) -> str:
        try:
            if spec.kind == "json_object":
                return llguidance.LLMatcher.grammar_from_json_schema(
                    {"type": "object"}, overrides=JSON_OPTIONS)
            if spec.kind == "json_schema":
                return llguidance.LLMatcher.grammar_from_json_schema(
                    close_objects(json.loads(spec.value)), overrides=JSON_OPTIONS)
            if spec.kind == "regex":
                return llguidance.LLMatcher.grammar_from_regex(spec.value)
            if spec.kind == "choice":
                return llguidance.grammar_from("choice", spec.value)
            return llguidance.grammar_from("grammar", spec.value)  # Lark or GBNF
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"cannot compile the {_describe(spec)}: {exc}", spec.param) from None


def _describe(spec: StructuredOutput) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object grammar",
            "regex": "regex", "choice": "choice list", "grammar": "grammar"}[spec.kind]
