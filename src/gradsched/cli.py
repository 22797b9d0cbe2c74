"""The ``gradsched`` command.

Each subcommand lives in its own module under ``gradsched.commands`` with a
``register(subparsers)`` function that adds its parser and sets ``func``.  Errors a
user can cause (:class:`~gradsched.errors.GradschedError`) print one line and exit
2, never a traceback; workers that fail (:class:`~gradsched.errors.WorkersFailed`)
give their own exit status.  Any other exception is a fault of gradsched: its traceback
is printed with a one-line request to report it, and the exit status is 1.  Conventions
shared by every subcommand (``--json``, ``--log-level``, ``--workers``) are in docs/cli.md.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import sys
import traceback

from gradsched import __version__
from gradsched.errors import GradschedError

# Subcommand modules, in help order.  Each is imported only when the CLI starts,
# and torch-using ones import torch only inside their ``run``.
COMMANDS = ("simulate", "plan", "advise", "train", "profile", "netbench", "compare", "bench", "testbed")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_ENV = "GRADSCHED_LOG_LEVEL"  # how the level reaches worker processes (gradsched.torch.worker)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradsched",
        description="Schedule gradient communication for data-parallel PyTorch training: profile a model and a "
                    "network, plan, predict by simulation, run the plan, compare measured against predicted.",
        epilog="Start with 'gradsched simulate' (no PyTorch needed) or 'gradsched bench' (real training). "
               "--json PATH writes JSON (PATH '-': stdout) in every command but testbed up and testbed down; "
               "--workers is the number of ranks.")
    parser.add_argument("--version", action="version", version=f"gradsched {__version__}")
    _add_log_level(parser, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"gradsched.commands.{name}").register(sub)
    for p in _all_subparsers(sub):
        _add_log_level(p, argparse.SUPPRESS)  # before or after the subcommand, as the user likes
    for p in (parser, *_all_subparsers(sub)):
        _plain_help(p)
    return parser


def plain_text(text: str) -> str:
    """Help text without reST markup: ``:func:`x``` and ````x```` read as x (the module docstrings that
    serve as descriptions are written for the API docs)."""
    text = re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text)
    return text.replace("`", "")


def _plain_help(p: argparse.ArgumentParser) -> None:
    """The parser's description, epilog and every option's help as plain text."""
    for attr in ("description", "epilog"):
        if getattr(p, attr):
            setattr(p, attr, plain_text(getattr(p, attr)))
    for action in p._actions:
        if isinstance(action.help, str):
            action.help = plain_text(action.help)
        for choice in getattr(action, "_choices_actions", ()):  # the subcommands' one-line help
            if isinstance(choice.help, str):
                choice.help = plain_text(choice.help)


def _add_log_level(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument("--log-level", choices=LOG_LEVELS, type=str.lower, default=default,
                   help="show gradsched's log from this level on, workers' included: info shows run-time auto's "
                        "decisions, debug every check (default warning)")


def _all_subparsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    out = []
    for p in sub.choices.values():
        out.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.extend(_all_subparsers(action))
    return out


def setup_logging(level: str) -> None:
    """Log to stderr at ``level``, here and (through the environment) in the workers this command starts."""
    os.environ[LOG_ENV] = level
    logging.basicConfig(level=level.upper(), format="gradsched %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "log_level", None):
        setup_logging(args.log_level)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a report to a full disk or a closed pipe fails here, as an error of its own
        return code
    except GradschedError as exc:
        print(f"gradsched {args.command}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_status", 2))
    except OSError as exc:
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EPIPE):  # stdout: disk full, pipe closed
            _quiet_stdout()
            print(f"gradsched {args.command}: error: the output cannot be written: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        if exc.filename is None:  # not a path the user gave
            return _report_bug(args.command)
        print(f"gradsched {args.command}: error: {exc.filename}: {exc.strerror or exc}; give a path that can be "
              "written (or read)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gradsched {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a fault of gradsched, not of the input
        return _report_bug(args.command)


def _quiet_stdout() -> None:
    """Send what is left of stdout nowhere: the interpreter's own flush at exit would fail again."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass


def _report_bug(command: str) -> int:
    """Inside an ``except``: the traceback (what a report needs) and a one-line request; exit status 1."""
    traceback.print_exc()
    print(f"gradsched {command}: internal error in gradsched {__version__}; please report it as a bug, "
          "with the traceback above and the command line", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
