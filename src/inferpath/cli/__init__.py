"""The ``inferpath`` command. The library never parses argv; this package does.

Each subcommand lives in its own module with ``register(subparsers)``, which adds a parser
whose ``func`` default takes the parsed args and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module name -> subcommands it registers
_SUBCOMMAND_MODULES = ("tokenize", "generate", "serve", "explain", "models", "quantize")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferpath",
        description="A glass-box LLM inference engine.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"inferpath.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"inferpath.cli.{module_name}":
                continue  # subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"inferpath {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
