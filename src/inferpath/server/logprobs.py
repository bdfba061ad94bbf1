"""Token logprobs in the two shapes of the OpenAI API.

- completions (``logprobs: N``): ``{tokens, token_logprobs, top_logprobs, text_offset}``,
  four parallel lists; ``top_logprobs[i]`` maps token text to logprob for the chosen
  token and the top N.
- chat (``logprobs: true, top_logprobs: N``): ``{"content": [{token, logprob, bytes,
  top_logprobs: [{token, logprob, bytes}]}]}``.

A token's text is its bytes decoded as UTF-8 with replacement: a byte-level token that
holds half a character shows as U+FFFD, and ``bytes`` carries the exact value.
"""

from __future__ import annotations

from typing import Any


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def completion_logprobs(tokenizer: Any, entries: list[Any], text_offset: int) -> dict[str, Any]:
    """Completions-API logprobs of ``entries`` (TokenLogprobs), offsets counted from
    ``text_offset`` (the characters of the choice's text before the first entry)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    offsets: list[int] = []
    for entry in entries:
        text = token_text(tokenizer, entry.token_id)
        tokens.append(text)
        token_logprobs.append(_finite(entry.logprob))
        top = {token_text(tokenizer, tid): _finite(lp) for tid, lp in entry.top}
        top.setdefault(text, _finite(entry.logprob))
        top_logprobs.append(top)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs, "text_offset": offsets}


def prompt_completion_logprobs(tokenizer: Any, prompt_ids: list[int],
                               entries: list[Any]) -> dict[str, Any]:
    """Completions-API logprobs of the prompt (``echo`` with ``logprobs``): every prompt
    token, the first with None (nothing precedes it), as vLLM returns them."""
    scored = completion_logprobs(tokenizer, [e for e in entries[1:] if e is not None], 0)
    first = token_text(tokenizer, prompt_ids[0])
    return {"tokens": [first] + scored["tokens"],
            "token_logprobs": [None] + scored["token_logprobs"],
            "top_logprobs": [None] + scored["top_logprobs"],
            "text_offset": [0] + [offset + len(first) for offset in scored["text_offset"]]}


def merge_completion_logprobs(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """Two completions-API logprobs objects, one after the other."""
    return {key: first[key] + then[key] for key in first}


def chat_logprobs(tokenizer: Any, entries: list[Any], num_top: int) -> dict[str, Any]:
    """Chat-API logprobs of ``entries``, each with its ``num_top`` most likely tokens."""
    content = []
    for entry in entries:
        content.append({
            **_chat_token(tokenizer, entry.token_id, entry.logprob),
            "top_logprobs": [_chat_token(tokenizer, tid, lp) for tid, lp in entry.top[:num_top]],
        })
    return {"content": content}


def _chat_token(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": _finite(logprob),
            "bytes": list(raw)}


def _finite(logprob: float) -> float:
    # JSON has no -inf; OpenAI reports impossible tokens as -9999.0.
    return max(float(logprob), -9999.0)
