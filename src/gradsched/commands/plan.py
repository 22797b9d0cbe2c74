"""``gradsched plan``: write one strategy's plan as ``gradsched.plan/1``."""

from __future__ import annotations

import argparse

from gradsched.commands._inputs import (add_model_args, check_inputs, check_opt_keys, load_cluster, load_profile,
                                        planner_options, strategy_list, workers_text)
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import GradschedError
from gradsched.planners import make_plan
from gradsched.sim import simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="write a strategy's plan to a file",
                       description="Plan one strategy for a profile and a network and write gradsched.plan/1.")
    add_model_args(p)
    p.add_argument("--strategy", required=True, help="strategy name")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="where to write the plan (this, --json, or both)")
    add_json_arg(p, "the plan (gradsched.plan/1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.output and args.json is None:
        raise GradschedError("give -o PLAN.json to write the plan to a file, or --json - to print it")
    names = strategy_list(args.strategy)
    if len(names) != 1:
        raise GradschedError("gradsched plan takes exactly one --strategy")
    check_opt_keys(names, args)
    profile = load_profile(args)
    cluster = load_cluster(args)
    check_inputs(profile, cluster)
    plan = make_plan(names[0], profile, cluster, **planner_options(names[0], args))
    plan.check(profile)
    if args.output:
        plan.save(args.output)
    result = simulate(plan, profile, cluster, timeline=False)
    if not to_stdout(args):
        print(f"{'wrote ' + args.output if args.output else 'planned'}: {plan.strategy}, {len(plan.operations)} "
              f"operations, hash {plan.hash}, predicted {1e3 * result.iteration_s:.2f} ms per iteration on "
              f"{workers_text(cluster)}")
    emit_json(args, plan.to_dict())
    return 0
