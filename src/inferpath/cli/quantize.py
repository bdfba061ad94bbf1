"""``inferpath quantize IN OUT --type Q4_K``: a GGUF file with its float weights quantized."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from inferpath.weights.quantize import QUANTIZATION_TYPES

    parser = subparsers.add_parser(
        "quantize", help="write a GGUF file with its float weights quantized (llama.cpp loads it)",
        description="Copy a GGUF file (F32/F16/BF16 weights) with its 2-D weights quantized; "
                    "metadata, norms and already quantized tensors are copied unchanged.")
    parser.add_argument("source", help="a .gguf file with float weights (a Hugging Face directory: "
                                       "convert it with llama.cpp's convert_hf_to_gguf.py first)")
    parser.add_argument("target", help="the .gguf file to write")
    parser.add_argument("--type", required=True, type=str.upper,
                        choices=[name.upper() for name in QUANTIZATION_TYPES], help="block format")
    parser.set_defaults(func=run_quantize)


def run_quantize(args: argparse.Namespace) -> int:
    from inferpath.weights.quantize import write_quantized_gguf

    source, target = Path(args.source).expanduser(), Path(args.target).expanduser()
    if not source.is_file() or source.suffix != ".gguf":
        raise ValueError(f"{source}: not a .gguf file; `inferpath quantize` reads GGUF files "
                         "(convert a Hugging Face directory with llama.cpp's convert_hf_to_gguf.py, "
                         "or quantize it on load with --quantization)")
    if target.resolve() == source.resolve():
        raise ValueError(f"{target}: the target must differ from the source")
    start = time.perf_counter()
    written = write_quantized_gguf(source, target, args.type)
    counts = ", ".join(f"{n} {kind}" for kind, n in Counter(written.values()).most_common())
    print(f"{target}: {target.stat().st_size / 1e6:.1f} MB ({counts} tensors) in {time.perf_counter() - start:.1f} s")
    return 0
