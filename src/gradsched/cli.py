"""The ``gradsched`` command.

Each subcommand lives in its own module under ``gradsched.commands`` with a
``register(subparsers)`` function that adds its parser and sets ``func``.  Errors a
user can cause (:class:`~gradsched.errors.GradschedError`) print one line and exit
2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gradsched.errors import GradschedError

# Subcommand modules, in help order.  Each is imported only when the CLI starts,
# and torch-using ones import torch only inside their ``run``.
COMMANDS = ("simulate", "plan", "advise", "train", "profile", "netbench", "compare", "bench", "testbed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradsched",
        description="Schedule gradient communication for data-parallel PyTorch training: profile a model and a "
                    "network, plan, predict by simulation, run the plan, compare measured against predicted.",
        epilog="Start with `gradsched simulate` (no PyTorch needed) or `gradsched bench` (real training).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gradsched.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gradsched.commands.{name}":
                continue  # not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GradschedError as exc:
        print(f"gradsched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gradsched {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
