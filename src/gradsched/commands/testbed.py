"""``gradsched testbed up|down|status``: an emulated multi-host network (needs root)."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.testbed import (DEFAULT_PREFIX, SUBNET, Testbed, check_ranks_per_host, foreign_namespaces, format_rate,
                               host_ranks, read_status, teardown)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "testbed", help="emulated multi-host network: namespaces and shaped links (root)",
        description=f"One network namespace per host, addresses in {SUBNET}, joined by a bridge; "
                    "each host's link capped both ways with tc tbf. Needs root. "
                    "See docs/testbed.md.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="create (or repair, or reshape) the testbed; idempotent")
    up.add_argument("--hosts", type=int, default=2, metavar="N", help="number of emulated hosts (network namespaces), "
                    "default 2 (`gradsched bench --hosts N --ranks-per-host M` brings up its own)")
    up.add_argument("--ranks-per-host", type=int, default=1, metavar="M",
                    help="ranks you mean to run in each host (default 1): prints each host's global ranks and the "
                         "torchrun command that starts them there (docs/testbed.md)")
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


def layout_lines(testbed: Testbed, ranks_per_host: int) -> list[str]:
    """Each host's global ranks and the command that starts them there (``SCRIPT``: the user's)."""
    lines = [f"{testbed.hosts} host(s) x {ranks_per_host} rank(s): world size {testbed.hosts * ranks_per_host}; "
             f"ranks of one host talk over its loopback, hosts over the shaped links"]
    for i in range(testbed.hosts):
        ranks = host_ranks(i, ranks_per_host)
        argv = testbed.torchrun_argv(i, ["SCRIPT"], ranks_per_host=ranks_per_host)
        lines.append(f"  {testbed.namespace(i)} ranks {ranks.start}-{ranks.stop - 1}: "
                     f"ip netns exec {testbed.namespace(i)} torchrun {' '.join(argv[3:])}")
    return lines


def hint_lines(testbed: Testbed, removal: str) -> list[str]:
    """How to use this testbed (its prefix in every command): run on a host, see it, remove it."""
    hosts = f"{testbed.namespace(0)}..{testbed.namespace(testbed.hosts - 1)}" if testbed.hosts > 1 else \
        testbed.namespace(0)
    return [f"  run a command on host I: ip netns exec {testbed.prefix}-hI COMMAND (hosts {hosts}; "
            f"host 0 is {testbed.addresses[0]}: torchrun's --rdzv-endpoint {testbed.addresses[0]}:29500, "
            "docs/torchrun.md)",
            f"  see it: gradsched testbed status --prefix {testbed.prefix}; {removal}"]


def _up(args: argparse.Namespace) -> int:
    testbed = Testbed(hosts=args.hosts, rate=args.rate, prefix=args.prefix)
    check_ranks_per_host(args.ranks_per_host)
    if not args.hold:
        # SIGTERM while setting up must clean up like Ctrl-C does: up() removes a
        # half-made testbed on any exception.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        testbed.up()
        print(f"testbed {args.prefix}: up, {args.hosts} host(s) at {format_rate(testbed.rate_bps)}: "
              f"{', '.join(testbed.addresses)}")
        print("\n".join(hint_lines(testbed, f"remove it: gradsched testbed down --prefix {args.prefix}")))
        if args.ranks_per_host > 1:
            print("\n".join(layout_lines(testbed, args.ranks_per_host)))
        return 0
    # The context manager removes the testbed on Ctrl-C and on SIGTERM (which it
    # re-delivers afterwards, so the exit status still says "terminated").
    with testbed:
        print(f"testbed {args.prefix}: up, {args.hosts} host(s) at {format_rate(testbed.rate_bps)}: "
              f"{', '.join(testbed.addresses)}", flush=True)
        print("\n".join(hint_lines(testbed, "Ctrl-C removes it")), flush=True)
        if args.ranks_per_host > 1:
            print("\n".join(layout_lines(testbed, args.ranks_per_host)), flush=True)
        while True:
            signal.pause()
