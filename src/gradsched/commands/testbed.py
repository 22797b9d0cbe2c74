"""``gradsched testbed up|down|status``: an emulated multi-host network (needs root)."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.testbed import (DEFAULT_PREFIX, SUBNET, Testbed, foreign_namespaces, format_rate, read_status,
                               teardown)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "testbed", help="emulated multi-host network: namespaces and shaped links (root)",
        description=f"One network namespace per host, addresses in {SUBNET}, joined by a bridge; "
                    "each host's link capped both ways with tc tbf. Needs root. "
                    "See docs/testbed.md.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="create (or repair, or reshape) the testbed; idempotent")
    up.add_argument("--hosts", type=int, default=2, metavar="N", help="number of emulated hosts (network namespaces), default 2; "
                    "`gradsched train/bench --workers N` then runs one rank on each")
    up.add_argument("--rate", default="1gbit", metavar="RATE",
                    help="link cap per host and direction, e.g. 100mbit, 500mbit, 1gbit (default)")
    up.add_argument("--hold", action="store_true",
                    help="stay in the foreground and remove the testbed on exit (Ctrl-C, SIGTERM)")

    down = actions.add_parser("down", help="remove every namespace (with its links and qdiscs) the testbed made")

    status = actions.add_parser("status", help="show what exists now")
    add_json_arg(status, "the state, one object,")

    for q in (up, down, status):
        q.add_argument("--prefix", default=DEFAULT_PREFIX,
                       help=f"name prefix of namespaces and links (default {DEFAULT_PREFIX!r}); "
                            "lets several testbeds coexist")
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "up":
        return _up(args)
    if args.action == "down":
        removed = teardown(args.prefix)
        print(f"testbed {args.prefix}: removed {len(removed)} namespace(s)"
              + (f": {', '.join(removed)}" if removed else ""))
        for name in foreign_namespaces(args.prefix):
            print(f"testbed {args.prefix}: left netns {name}: not made by the gradsched testbed")
        return 0
    state = read_status(args.prefix)
    if not to_stdout(args):
        print(state.describe())
    emit_json(args, state.to_dict())
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _up(args: argparse.Namespace) -> int:
    testbed = Testbed(hosts=args.hosts, rate=args.rate, prefix=args.prefix)
    if not args.hold:
        # SIGTERM while setting up must clean up like Ctrl-C does: up() removes a
        # half-made testbed on any exception.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        testbed.up()
        print(f"testbed {args.prefix}: up, {args.hosts} host(s) at {format_rate(testbed.rate_bps)}: "
              f"{', '.join(testbed.addresses)}; remove with `gradsched testbed down`")
        return 0
    # The context manager removes the testbed on Ctrl-C and on SIGTERM (which it
    # re-delivers afterwards, so the exit status still says "terminated").
    with testbed:
        print(f"testbed {args.prefix}: up, {args.hosts} host(s) at {format_rate(testbed.rate_bps)}: "
              f"{', '.join(testbed.addresses)}; Ctrl-C removes it", flush=True)
        while True:
            signal.pause()
