"""The command line's one convention for ``--json`` (docs/cli.md).

Every subcommand that can report JSON takes ``--json [PATH]``: a path writes the
JSON there, ``-`` (or ``--json`` alone, the old form) prints it on stdout instead of
the human-readable report, so ``gradsched CMD --json - | jq`` works everywhere."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gradsched._files import output_error, write_text

STDOUT = "-"


def add_json_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--json [PATH]``: write ``what`` to PATH, or to stdout for ``-`` or no PATH."""
    p.add_argument("--json", nargs="?", const=STDOUT, default=None, metavar="PATH",
                   help=f"write {what} as JSON to PATH ('-' or no PATH: stdout, instead of the report)")


def to_stdout(args: argparse.Namespace) -> bool:
    """True when ``--json`` asks for JSON on stdout (the report then goes nowhere, or to stderr)."""
    return getattr(args, "json", None) == STDOUT


def emit_json(args: argparse.Namespace, data: Any, *, indent: int | None = 1) -> None:
    """Write ``data`` where ``--json`` says (nothing when it was not given)."""
    dest = getattr(args, "json", None)
    if dest is None:
        return
    text = json.dumps(data, indent=indent)
    if dest == STDOUT:
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except OSError as exc:  # stdout on a full disk (> /dev/full) or a closed pipe
            sys.stdout = open(os.devnull, "w")  # nothing more to write there, at exit either
            raise output_error("stdout", exc) from None
        return
    write_text(dest, text + "\n")  # a full disk or a folder not writable: one line naming the path
    print(f"wrote {dest}")
