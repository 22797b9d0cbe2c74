"""``gradsched simulate``: plan and simulate strategies, print a comparison."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from gradsched.commands._inputs import (add_model_args, check_inputs, check_opt_keys, load_cluster, load_profile,
                                        planner_options, strategy_list, workers_text)
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import GradschedError
from gradsched.plan import HIER, Plan
from gradsched.planners import make_plan
from gradsched.sim import simulate

MAX_CHANNELS = 1024  # more channels than operations change nothing; a billion is a typo

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict the iteration time of strategies by simulation",
                       description="Plan each strategy for a profile and a network, simulate one iteration, "
                                   "and compare. Without --profile: the bundled GoogLeNet profile.")
    add_model_args(p)
    p.add_argument("--strategy", default="all", help="comma-separated strategy names, or 'all' (default)")
    p.add_argument("--plan", action="append", default=[], metavar="PLAN.json",
                   help="simulate this plan file (repeatable; replaces --strategy)")
    p.add_argument("--channels", type=int, default=1, help=f"parallel communication channels, 1 to {MAX_CHANNELS} "
                                                            "(default 1)")
    add_json_arg(p, "one list, one object per strategy,")
    p.add_argument("--trace", metavar="OUT.json", help="Chrome trace of the simulated timelines (one process per strategy)")
    p.add_argument("--plot", metavar="OUT.png", help="Gantt chart of the simulated timelines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.channels <= MAX_CHANNELS:
        raise GradschedError(f"--channels must be between 1 and {MAX_CHANNELS}, got {args.channels}")
    profile = load_profile(args)
    cluster = load_cluster(args)
    check_inputs(profile, cluster)
    rows: list[dict[str, Any]] = []
    timelines = []
    for name, plan, plan_s in _plans(args, profile, cluster):
        result = simulate(plan, profile, cluster, channels=args.channels, timeline=bool(args.trace or args.plot))
        row = {"strategy": name, "iteration_s": result.iteration_s, "exposed_comm_s": result.exposed_comm_s,
               "compute_s": result.compute_s, "comm_s": result.comm_s, "operations": result.operations,
               "peak_extra_bytes": result.peak_extra_bytes, "plan_s": plan_s, "options": plan.options,
               "workers": cluster.world_size, "model": profile.model}
        if cluster.topology is not None:
            row.update(nodes=cluster.topology.nodes, ranks_per_node=cluster.topology.ranks_per_node,
                       hier_operations=sum(op.collective == HIER for op in plan.operations))
        rows.append(row)
        if result.timeline is not None:
            result.timeline.meta["iteration_s"] = result.iteration_s
            timelines.append((name, result.timeline))
    if args.trace:
        _save_trace(timelines, args.trace)
    if args.plot:
        from gradsched.plot import gantt

        gantt(timelines, args.plot)
    if not to_stdout(args):
        print_table(rows, profile.model, workers_text(cluster))
    emit_json(args, rows)
    return 0


def _plans(args: argparse.Namespace, profile, cluster):
    """(label, plan, seconds spent planning) for each --plan file, else each --strategy."""
    if args.plan:
        for path in args.plan:
            plan = Plan.load(path, profile)
            yield plan.strategy, plan, 0.0
        return
    names = strategy_list(args.strategy)
    check_opt_keys(names, args)
    for name in names:
        opts = planner_options(name, args)
        t0 = time.perf_counter()
        plan = make_plan(name, profile, cluster, **opts)
        yield name, plan, time.perf_counter() - t0


def _save_trace(timelines, path: str) -> None:
    """One strategy: its timeline as is (tracks compute, comm0...); several: one process each."""
    from gradsched.timeline import Event, Timeline

    if len(timelines) == 1:
        timelines[0][1].save_chrome_trace(path)
        return
    merged = Timeline(meta={"strategies": [n for n, _ in timelines]})
    for rank, (name, tl) in enumerate(timelines):
        merged.events.extend(Event(f"{e.name}", e.cat, f"{name}:{e.track}", e.start_s, e.dur_s, rank, e.args)
                             for e in tl.events)
    merged.save_chrome_trace(path)


def print_table(rows: list[dict[str, Any]], model: str, workers: str) -> None:
    base = next((r["iteration_s"] for r in rows if r["strategy"] == "wfbp"), rows[0]["iteration_s"])
    base_name = "wfbp" if any(r["strategy"] == "wfbp" for r in rows) else rows[0]["strategy"]
    print(f"{model} on {workers} (predicted)")
    head = (f"{'strategy':<14} {'iter ms':>9} {'vs ' + base_name:>9} {'exposed ms':>10} {'ops':>6} {'extra MB':>9} "
            f"{'plan ms':>8}  notes")
    print(head)
    print("-" * len(head))
    for r in rows:
        note = ""
        if "chose" in r["options"]:
            note = f"chose {r['options']['chose']} {json.dumps(r['options']['chosen_options'])}"
        print(f"{r['strategy']:<14} {1e3 * r['iteration_s']:>9.2f} {base / r['iteration_s']:>8.3f}x "
              f"{1e3 * r['exposed_comm_s']:>10.2f} {r['operations']:>6} {r['peak_extra_bytes'] / 2**20:>9.2f} "
              f"{1e3 * r['plan_s']:>8.1f}  {note}")
