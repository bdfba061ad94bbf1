"""Stage 1: text <-> token ids, with our own byte-level BPE.

``load_tokenizer(path)`` reads a GGUF file, a tokenizer.json (file or directory) or a
tiktoken rank file; ``train_bpe`` learns a new one. See ``tokenizer.py`` for the Tokenizer.
"""

from inferpath.tokenizer.load import load_tokenizer
from inferpath.tokenizer.tokenizer import AddedToken, Tokenizer

__all__ = ["AddedToken", "Tokenizer", "load_tokenizer"]
