"""Argument helpers shared by the planning commands: profile, cluster, strategy options."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gradsched._validate import MAX_SECONDS, MAX_WORLD_SIZE
from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.planners import get_planner, strategy_names
from gradsched.planners.registry import check_options, planner_option_specs
from gradsched.profile import Profile


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="P.json", help="gradsched.profile/1 file, or bundled:NAME (default: bundled:googlenet)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="data-parallel ranks to plan and predict for (default 8, or a two-level cluster's own); "
                        "nothing is launched. With --nodes and --ranks-per-node, workers = nodes x ranks-per-node")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="nodes to plan for, with --ranks-per-node (a cluster with a topology, docs/formats.md: "
                        "both levels are extrapolated to N x M)")
    p.add_argument("--ranks-per-node", type=int, metavar="M", help="ranks (GPUs) per node, with --nodes")
    net = p.add_argument_group("network (default: the bundled 10GbE cluster measured with GoogLeNet)")
    net.add_argument("--cluster", metavar="C.json", help="gradsched.cluster/1 file extrapolated to --workers, or bundled:NAME "
                                                         "(googlenet-10gbe: OSU table; googlenet-intrain: in-training times)")
    net.add_argument("--alpha", type=float, metavar="SECONDS", help="all-reduce start-up time at --workers ranks")
    net.add_argument("--beta", type=float, metavar="SECONDS_PER_BYTE", help="all-reduce time per byte at --workers ranks")
    p.add_argument("--opt", action="append", default=[], metavar="[STRATEGY.]KEY=VALUE",
                   help="planner option, e.g. ddp.bucket_cap_mb=5 or density=0.01 (repeatable)")
    p.add_argument("--density", type=float, help="allow top-k sparsification at this density (sparse strategies, auto)")


def load_profile(args: argparse.Namespace) -> Profile:
    from gradsched.bundled import bundled_profile

    if not args.profile:
        return bundled_profile()
    if args.profile.startswith("bundled:"):
        return bundled_profile(args.profile.removeprefix("bundled:"))
    return Profile.load(args.profile)


def load_cluster(args: argparse.Namespace) -> Cluster:
    nodes = _nodes(args)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORLD_SIZE:
        raise GradschedError(f"--workers must be at least 1 and at most {MAX_WORLD_SIZE:,}, got {args.workers}")
    cluster = _flat_or_file(args, nodes)
    if nodes is not None:
        if cluster.topology is None:
            raise GradschedError("--nodes/--ranks-per-node need a cluster with a topology (two levels, "
                                 "docs/formats.md); this one has one flat level: give --workers "
                                 f"{nodes[0] * nodes[1]} for the flat model")
        return cluster.at_topology(*nodes)
    if args.workers is None and cluster.topology is not None:
        return cluster  # a two-level cluster as measured
    workers = 8 if args.workers is None else args.workers
    return cluster.at_world_size(workers) if cluster.world_size != workers else cluster


MAX_PROCESSES = 256  # ranks a command starts on this machine (loopback or testbed): each is a PyTorch process


def check_processes(flag: str, n: int) -> int:
    """``n`` ranks to start on this machine, from 1 to :data:`MAX_PROCESSES`; else a one-line error
    (``train --workers 1000000000`` started processes until memory ran out, printing nothing)."""
    if not 1 <= n <= MAX_PROCESSES:
        raise GradschedError(f"{flag} must be at least 1 and at most {MAX_PROCESSES} (each rank is a process on this "
                             f"machine; plan larger clusters with `gradsched simulate --workers N`), got {n:,}")
    return n


def workers_text(cluster: Cluster) -> str:
    """``"1024 workers (128 nodes x 8)"``, or ``"8 workers"`` on a flat cluster."""
    topo = cluster.topology
    nodes = f" ({topo.nodes} nodes x {topo.ranks_per_node})" if topo is not None else ""
    return f"{cluster.world_size} workers{nodes}"


def _nodes(args: argparse.Namespace) -> tuple[int, int] | None:
    """``(--nodes, --ranks-per-node)`` checked, or None; ``--workers``, if given, must be their product."""
    if args.nodes is None and args.ranks_per_node is None:
        return None
    if args.nodes is None or args.ranks_per_node is None:
        raise GradschedError("--nodes and --ranks-per-node go together (workers = nodes x ranks-per-node)")
    for flag, x in (("--nodes", args.nodes), ("--ranks-per-node", args.ranks_per_node)):
        if not 1 <= x <= MAX_WORLD_SIZE:
            raise GradschedError(f"{flag} must be at least 1 and at most {MAX_WORLD_SIZE:,}, got {x}")
    world = args.nodes * args.ranks_per_node
    if world > MAX_WORLD_SIZE:
        raise GradschedError(f"--nodes x --ranks-per-node = {world:,} ranks, above the most ({MAX_WORLD_SIZE:,})")
    if args.workers is not None and args.workers != world:
        raise GradschedError(f"--workers {args.workers} but --nodes {args.nodes} x --ranks-per-node "
                             f"{args.ranks_per_node} = {world}; give one or the other")
    return args.nodes, args.ranks_per_node


def _flat_or_file(args: argparse.Namespace, nodes: tuple[int, int] | None) -> Cluster:
    """The cluster of --alpha/--beta (at --workers) or --cluster (as stored; bundled: at --workers)."""
    workers = nodes[0] * nodes[1] if nodes else (8 if args.workers is None else args.workers)
    if (args.alpha is None) != (args.beta is None):
        raise GradschedError("--alpha and --beta go together")
    if args.alpha is not None:
        if args.cluster:
            raise GradschedError("give either --cluster or --alpha/--beta, not both")
        for flag, value, top in (("--alpha", args.alpha, MAX_SECONDS), ("--beta", args.beta, 1.0)):
            if not 0 <= value <= top:
                raise GradschedError(f"{flag} must be a finite number between 0 and {top:g}, got {value}")
        return Cluster.alpha_beta(args.alpha, args.beta, workers)
    from gradsched.bundled import bundled_cluster

    if not args.cluster:
        return bundled_cluster(world_size=workers)
    if args.cluster.startswith("bundled:"):
        return bundled_cluster(args.cluster.removeprefix("bundled:"), world_size=workers)
    return Cluster.load(args.cluster)


def check_inputs(profile: Profile, cluster: Cluster) -> None:
    """Inputs whose every figure would be 0: a table of 0 ms iterations and 0/0 ratios says nothing."""
    cost = cluster.cost("allreduce")
    if profile.compute_s == 0 and cost.alpha_s == 0 and cost.beta_s_per_byte == 0 and not cost.points:
        raise GradschedError("the profile's times (forward_s, backward_s, update_s, other_s) and the network's "
                             "costs (--alpha, --beta) are all 0: every iteration would take 0 s; give measured "
                             "times or costs")


def check_opt_keys(names: list[str], args: argparse.Namespace) -> None:
    """An ``--opt KEY=VALUE`` (or ``--density``) that none of the strategies ``names`` takes is an error, not ignored."""
    if args.density is not None and not any("density" in planner_option_specs(n) for n in names):
        raise GradschedError(f"--density applies to the sparse strategies (topk, omgs) and auto, not to "
                             f"{', '.join(names)}")
    for item in args.opt:
        key = item.partition("=")[0]
        if "." in key:  # STRATEGY.KEY: checked against that strategy's own options, planned or not
            planner_options(key.rpartition(".")[0], args)
            continue
        if not any(key in planner_option_specs(n) for n in names):
            raise GradschedError(f"--opt {item}: none of the strategies {', '.join(names)} has an option {key!r}; "
                                 "see docs/strategies.md (or name one: STRATEGY.KEY=VALUE)")


def strategy_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise GradschedError("--strategy needs at least one name")
    if names == ["all"]:
        return strategy_names()
    for name in names:
        get_planner(name)  # raises with the list of known names
    return names


def planner_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Options from ``--opt`` (and ``--density``) that planner ``name`` declares, typed and range-checked.

    ``STRATEGY.KEY=VALUE`` applies to that strategy only (and must be one of its
    options); ``KEY=VALUE`` to every strategy that has option ``KEY``."""
    specs = planner_option_specs(name)
    out: dict[str, Any] = {}
    if args.density is not None and "density" in specs:
        out["density"] = args.density
    for item in args.opt:
        key, sep, raw = item.partition("=")
        if not sep:
            raise GradschedError(f"--opt {item!r}: expected KEY=VALUE or STRATEGY.KEY=VALUE")
        target, dot, key = key.rpartition(".")
        if dot and target not in strategy_names():
            raise GradschedError(f"--opt {item!r}: unknown strategy {target!r}; known: {', '.join(strategy_names())}")
        if (dot and target != name) or (not dot and key not in specs):
            continue
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
        try:
            out[key] = check_options(name, {key: out[key]})[key]
        except GradschedError as exc:
            raise GradschedError(f"--opt {item}: {exc}") from None
    return out
