"""``gradsched plan``: write one strategy's plan as ``gradsched.plan/1``."""

from __future__ import annotations

import argparse

from gradsched.commands._inputs import (add_model_args, check_inputs, check_opt_keys, load_cluster, load_profile,
                                        planner_options, strategy_list, workers_text)
from gradsched.errors import GradschedError
from gradsched.planners import make_plan
from gradsched.sim import simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="write a strategy's plan to a file",
                       description="Plan one strategy for a profile and a network and write gradsched.plan/1.")
    add_model_args(p)
    p.add_argument("--strategy", required=True, help="strategy name")
    p.add_argument("-o", "--output", required=True, metavar="PLAN.json", help="where to write the plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = strategy_list(args.strategy)
    if len(names) != 1:
        raise GradschedError("gradsched plan takes exactly one --strategy")
    check_opt_keys(names, args)
    profile = load_profile(args)
    cluster = load_cluster(args)
    check_inputs(profile, cluster)
    plan = make_plan(names[0], profile, cluster, **planner_options(names[0], args))
    plan.check(profile)
    plan.save(args.output)
    result = simulate(plan, profile, cluster, timeline=False)
    print(f"wrote {args.output}: {plan.strategy}, {len(plan.operations)} operations, hash {plan.hash}, "
          f"predicted {1e3 * result.iteration_s:.2f} ms per iteration on {workers_text(cluster)}")
    return 0
