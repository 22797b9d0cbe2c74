"""``gradsched bench``: every strategy against PyTorch DDP, side by side, in one run.

    gradsched bench                                   # vgg, 2 hosts, auto vs DDP (testbed as root, else loopback)
    gradsched bench --model vgg --hosts 4 --rate 1gbit \\
        --strategies ddp,wfbp,mgwfbp,optimal,bytescheduler,usbyte,auto --json out.json --plot out.png
    gradsched bench --replay googlenet-k80 --hosts 4 --rate 2gbit --dilate 2   # emulated K80s, real communication

One job (one process per host) profiles the model and measures the network in
place, then trains every strategy and every DDP bucket size in rotating rounds so
that machine noise hits all alike, and reports per strategy: the median iteration
time, the speed-up over DDP's default and over the best DDP bucket size, the ratio
to the lower bound, and the simulator's prediction with its error.  ``ddp`` is
PyTorch's own DistributedDataParallel; every other name is a gradsched plan run by
gradsched's executor.  docs/bench.md explains each figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gradsched._signals import sigterm_unwinds
from gradsched._validate import timeout_s
from gradsched.bench_memory import phase_lines
from gradsched.byte_scaling import add_scale_arg
from gradsched.calibration import contention_history
from gradsched.commands._inputs import check_processes
from gradsched.commands._model import BUILT_IN, check_model
from gradsched.commands._model import HELP as MODEL_HELP
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import GradschedError
from gradsched.jobs import bench as bench_rules
from gradsched.jobs.bench import FAITHFUL_AGGREGATE_BPS, replay_model, shaped_rate, with_bound_checks
from gradsched.jobs.budget import BENCH_TARGET_S, TRIMMED_STEPS, Trim
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.launch import PREFIXES
from gradsched.jobs.results import UNITS, BenchJsonRow, BenchResult, BenchRow, Contention, Load, TrialDecision
from gradsched.jobs.rounds import LOADED_SHARE, MIN_COUNTED_ROUNDS, ROUND_TOL, loaded_rounds
from gradsched.jobs.results import to_emulated as undilate  # the old name
from gradsched.jobs.startup import AutoWarmup
from gradsched.testbed import check_ranks_per_host
from gradsched.tuning.candidates import TORCH_DDP

DEFAULT_MODEL = "vgg"
DEFAULT_STRATEGIES = "ddp,auto"
DEFAULT_BUCKETS = "1,5,25,100,all"  # DDP's bucket_cap_mb sweep; 25 is DDP's default (the "ddp" row)
DEFAULT_RATE = "1gbit"
DEFAULT_STEPS = 3
DEFAULT_ROUNDS = 6
TESTBED_PREFIX = PREFIXES["bench"]  # its own prefix: never touches a `gs` testbed the user has up
MODELS = BUILT_IN
WORKER = "gradsched.torch.jobs.bench_worker"  # what each rank runs: python -m WORKER config.json
# names that moved to the job wing (gradsched.jobs.bench, gradsched.jobs.results), importable here as before
__all__ = ["FAITHFUL_AGGREGATE_BPS", "auto_strategy", "entries", "register", "replay_model", "rows_for_json", "run",
           "shaped_rate", "table", "undilate", "with_bound_checks"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmark strategies against PyTorch DDP (and its bucket sizes)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"{MODEL_HELP} (default {DEFAULT_MODEL})")
    p.add_argument("--replay", default=None, metavar="PROFILE",
                   help="instead of --model: replay this profile (a gradsched.profile/1 file or a bundled name "
                   "such as googlenet-k80): real parameters and communication, compute emulated by waiting")
    p.add_argument("--dilate", type=float, default=1.0, metavar="K",
                   help="with --replay on the testbed: links shaped at --rate/K, compute times x K, reported times "
                   "/ K, to emulate a cluster faster than these cores can move (default 1)")
    add_scale_arg(p)
    p.add_argument("--prefix", default=TESTBED_PREFIX, help=f"testbed name prefix (default {TESTBED_PREFIX})")
    p.add_argument("--workers", "--hosts", dest="hosts", type=int, default=2, metavar="N",
                   help="hosts: testbed hosts (or nodes of local processes with --loopback), each running "
                        "--ranks-per-host ranks (default 2; --hosts is the same flag)")
    p.add_argument("--ranks-per-host", type=int, default=1, metavar="M",
                   help="ranks on each host (default 1): world size hosts x M; ranks of one host talk over its "
                        "loopback, hosts over the shaped links, and each rank gets torchrun's LOCAL_WORLD_SIZE=M, "
                        "LOCAL_RANK and GROUP_RANK (docs/testbed.md)")
    net = p.add_mutually_exclusive_group()
    net.add_argument("--rate", default=None, help=f"testbed link rate, e.g. 500mbit, 1gbit (root only; default "
                     f"{DEFAULT_RATE} as root)")
    net.add_argument("--loopback", action="store_true", help="local workers over loopback (the default without root)")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                   help=f"comma-separated; ddp = PyTorch DDP, fsdp2 = PyTorch FSDP2's fully_shard per block "
                        f"(default {DEFAULT_STRATEGIES})")
    p.add_argument("--density", type=float, default=None,
                   help="top-k density of the sparse strategies (topk, omgs) in --strategies")
    p.add_argument("--opt", action="append", default=[], metavar="[STRATEGY.]KEY=VALUE",
                   help="planner option of a gradsched row, e.g. wfbp.layerwise=true (repeatable; PyTorch DDP's "
                   "rows take --ddp-buckets); auto.adaptive=true: run-time auto's warm-up on a replay whatever "
                   "it costs (else planned at start-up where it would not fit its own 5-minute budget); auto.trials=2, "
                   "auto.trial_iterations=4 ...: run-time auto's other settings (docs/autotune.md)")
    p.add_argument("--ddp-buckets", default=None,
                   help=f"DDP bucket_cap_mb values to sweep, MB or 'all' (one bucket); 'none' to skip "
                   f"(default {DEFAULT_BUCKETS}; on a replay whose default rounds would not fit "
                   f"{BENCH_TARGET_S / 60:.0f} minutes, the largest are left out and the output says which)")
    _add_round_args(p)
    p.add_argument("--batch-size", type=int, default=16, help="per-worker batch size (default 16)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-iterations", type=int, default=5, help="profiler iterations (default 5)")
    p.add_argument("--net-reps", type=int, default=3, help="timed repetitions per size in the network benchmark")
    p.add_argument("--no-probe", action="store_true", help="skip the compute/communication contention probe")
    p.add_argument("--probe-s", type=float, default=22.0, metavar="SECONDS",
                   help="about how long the start-up probes take, contention then the runtimes' overheads, each "
                        "within its fewest and most repetitions (default 22)")
    p.add_argument("--contention-from", action="append", default=[], metavar="EARLIER.json",
                   help="an earlier `gradsched bench --json` of the same model, hosts, network and batch on this "
                        "machine: plan and predict with each contention figure at its median over it and this job "
                        "(repeatable)")
    p.add_argument("--resample-share", type=float, default=0.25, metavar="F",
                   help="between rounds, sample the contention probe and the small all-reduces again within this "
                   "share of the rounds' time; predictions use the medians over all samples (default 0.25; 0: "
                   "start-up figures only)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="stop the whole job after this (default 1800)")
    add_json_arg(p, "every figure (a list, one object per strategy and DDP bucket size)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="bar chart of the median iteration times")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _add_round_args(p: argparse.ArgumentParser) -> None:
    """How many rounds of how many steps, and when they may stop early (gradsched.jobs.rounds)."""
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per strategy per round (default {DEFAULT_STEPS}; {TRIMMED_STEPS} on a replay whose "
                   f"default rounds would not fit {BENCH_TARGET_S / 60:.0f} minutes)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds at most, the first --warmup-rounds not counted (default {DEFAULT_ROUNDS}; fewer where "
                   f"--round-tol stops them, or where a replay's would not fit {BENCH_TARGET_S / 60:.0f} minutes)")
    p.add_argument("--warmup-rounds", type=int, default=1,
                   help="rounds left out of the figures (default 1; a replay's skip their compute)")
    p.add_argument("--round-tol", type=float, default=ROUND_TOL, metavar="F",
                   help=f"stop the rounds once the last counted one moved no row's median by more than this share "
                   f"of it, after --min-rounds counted rounds (default {ROUND_TOL:g}; 0: every round)")
    p.add_argument("--min-rounds", type=int, default=MIN_COUNTED_ROUNDS, metavar="N",
                   help=f"counted rounds before --round-tol may stop them (default {MIN_COUNTED_ROUNDS})")


# ----------------------------------------------------------------------------- configuration
def split_auto_runtime(opts: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``--opt auto.adaptive=true|false`` (run-time ``auto``'s own setting, not a planner option: whether its
    warm-up runs in situ whatever it costs, gradsched.jobs.startup), and run-time ``auto``'s other settings
    (``auto.trials=2``, ``auto.trial_iterations=2`` ...: gradsched.tuning.config.OPTIONS, typed and checked;
    with any of them its warm-up is not shortened), apart from the planner options."""
    from gradsched.options import check
    from gradsched.tuning.config import OPTIONS

    settings = {o.name: o for o in OPTIONS if o.kind is not dict}
    runtime: dict[str, Any] = {}
    rest = []
    for item in opts:
        key, sep, raw = item.partition("=")
        name = key.strip().removeprefix("auto.") if key.strip().startswith("auto.") else ""
        if sep and name == "adaptive":
            value = raw.strip().lower()
            if value not in ("true", "false"):
                raise GradschedError(f"--opt {item}: auto.adaptive is true or false")
            runtime["adaptive"] = value == "true"
        elif sep and name in settings:
            runtime[name] = check(f"--opt {key.strip()}", settings[name], raw.strip())
        else:
            rest.append(item)
    return runtime, rest


def entries(strategies: str, buckets: str, density: float | None = None,
            opts: list[str] | None = None) -> list[BenchEntry]:
    """What to run (:func:`gradsched.jobs.bench.entries`), with ``--opt`` planner options
    (``[STRATEGY.]KEY=VALUE``) parsed, typed and checked for each named strategy."""
    from types import SimpleNamespace

    from gradsched.commands._inputs import planner_options
    from gradsched.planners import strategy_names

    known = set(strategy_names())
    names = {s.strip() for s in strategies.split(",") if s.strip()} & known  # unknown ones: entries' error
    runtime, opts = split_auto_runtime(opts or [])
    parsed = SimpleNamespace(density=None, opt=opts)
    chosen = {name: planner_options(name, parsed) for name in sorted(names)} if opts else {}
    if runtime and "auto" in names:
        chosen["auto"] = {**chosen.get("auto", {}), **runtime}
    return bench_rules.entries(strategies, buckets, density, chosen)


def _network(args: argparse.Namespace) -> str | None:
    """The testbed rate, or None for loopback."""
    root = os.geteuid() == 0
    if args.rate is not None:
        if not root:
            raise GradschedError("--rate shapes links on the testbed, which needs root: use --loopback or run as root")
        return args.rate
    if args.loopback or not root:
        return None
    return DEFAULT_RATE


def _check_args(args: argparse.Namespace, history: list[dict[str, float]]) -> None:
    """The flags' values, each a one-line error before any worker starts."""
    if args.rounds is None:  # the default, which a replay that would not fit its wall-time target may lower
        args.rounds, args.rounds_default = DEFAULT_ROUNDS, True
    if args.hosts < 2:
        raise GradschedError(f"--hosts must be at least 2 (data parallelism needs two workers), got {args.hosts}")
    check_ranks_per_host(args.ranks_per_host)
    check_processes("--hosts x --ranks-per-host", args.hosts * args.ranks_per_host)
    if (args.steps is not None and args.steps < 1) or args.rounds < 1 or args.batch_size < 1:
        raise GradschedError("--steps, --rounds and --batch-size must be at least 1")
    if not 0 <= args.round_tol < 1:
        raise GradschedError(f"--round-tol must be at least 0 and below 1, got {args.round_tol}")
    if args.min_rounds < 2:
        raise GradschedError(f"--min-rounds must be at least 2 (the rule compares a round with those before), "
                             f"got {args.min_rounds}")
    if not 0 <= args.warmup_rounds < args.rounds:
        raise GradschedError(f"--warmup-rounds must be between 0 and --rounds - 1 ({args.rounds - 1}), "
                             f"got {args.warmup_rounds}")
    if not 0 < args.lr < float("inf"):
        raise GradschedError(f"--lr must be a finite number above 0, got {args.lr}")
    args.timeout_s = timeout_s(args.timeout_s, "--timeout-s")  # as the runtime's timeout_s: one declaration
    if not 0 <= args.resample_share < 1:
        raise GradschedError(f"--resample-share must be at least 0 and below 1, got {args.resample_share}")
    if not args.probe_s > 0:
        raise GradschedError(f"--probe-s must be a positive number of seconds, got {args.probe_s}")
    if history and args.no_probe:
        raise GradschedError("--contention-from pools earlier figures with this job's probe: drop --no-probe")
    if args.replay is None:  # a replayed profile was checked when it was read (replay_model)
        check_model(args.model, seed=args.seed, batch_size=args.batch_size)


def _config(args: argparse.Namespace, out_dir: str, history: list[dict[str, float]], model: str,
            scale: int = 1, trimmed: Trim | None = None) -> BenchConfig:
    """The workers' configuration from the flags (``history``: --contention-from's figures, emulated seconds;
    ``trimmed``: the rows and steps cut to fit the wall-time target, :func:`_trim`)."""
    _check_args(args, history)
    rows = trimmed.entries if trimmed is not None else _checked_entries(args)
    steps = trimmed.steps if trimmed is not None else (args.steps or DEFAULT_STEPS)
    if scale > 1:
        from gradsched.byte_scaling import scale_entries

        rows = [BenchEntry.from_dict(e) for e in scale_entries(rows, scale)]  # type: ignore[arg-type]
    return BenchConfig(model=model, seed=args.seed, batch_size=args.batch_size, lr=args.lr,
                       entries=rows, steps=steps, warmup_steps=trimmed.warmup_steps if trimmed else 0,
                       rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                       profile_iterations=args.profile_iterations, net_reps=args.net_reps, probe=not args.no_probe,
                       probe_s=args.probe_s, resample_share=args.resample_share, contention_history=history,
                       timeout_s=args.timeout_s,
                       progress=not args.quiet, out_dir=out_dir,
                       backend="gloo", threads=1,  # CPU tensors over gloo; one compute thread per worker
                       dilate=args.dilate if args.replay is not None else 1.0, scale_bytes=scale,
                       round_tol=args.round_tol, min_rounds=args.min_rounds,
                       label=args.replay if args.replay is not None else args.model,
                       budget=_given(args).to_dict() if trimmed is not None else {})


def _given(args: argparse.Namespace) -> Any:
    """What the user set of what the 15-minute budget may cut (:class:`gradsched.jobs.budget.Given`): the
    workers fit it again once the start-up has measured a step."""
    from gradsched.jobs.budget import Given

    return Given(steps=args.steps is not None, buckets=args.ddp_buckets is not None,
                 rounds=not getattr(args, "rounds_default", False), default_steps=DEFAULT_STEPS,
                 default_rounds=DEFAULT_ROUNDS)


def _checked_entries(args: argparse.Namespace) -> list[BenchEntry]:
    """``entries`` from the command line; an ``--opt`` no row takes is an error, not ignored."""
    from gradsched.commands._inputs import check_opt_keys

    buckets = DEFAULT_BUCKETS if args.ddp_buckets is None else args.ddp_buckets
    out = entries(args.strategies, buckets, args.density, args.opt)
    check_opt_keys([e.strategy for e in out if not e.torch_ddp],
                   argparse.Namespace(density=None, opt=split_auto_runtime(args.opt)[1]))
    return out


# ----------------------------------------------------------------------------- launching
def _launch(cfg_path: Path, hosts: int, shaped: int | None, timeout_s: float, prefix: str,
            ranks_per_host: int = 1) -> None:
    """The workers, on loopback (``shaped`` None) or on a testbed of links shaped at ``shaped`` bits/s."""
    from gradsched.jobs.launch import Ranks, launch

    ranks = Ranks.of(WORKER, cfg_path, hosts=hosts, ranks_per_host=ranks_per_host, rate=shaped, prefix=prefix,
                     timeout_s=timeout_s)
    launch(ranks).check("the benchmark's workers")


# ----------------------------------------------------------------------------- reporting
def rows_for_json(result: BenchResult, meta: dict[str, Any]) -> list[BenchJsonRow]:
    """The JSON output: one object per strategy / DDP bucket size, each carrying the run's facts and
    ``units`` (its durations as :mod:`gradsched.jobs.results` declares them: read them back with
    :func:`~gradsched.jobs.results.read_bench_row`)."""
    shared = {**meta, "units": UNITS, "world_size": result["world_size"], "backend": result["backend"],
              "machine": result["machine"], "profile": result["profile"], "cluster": result["cluster"],
              "lower_bound": result["lower_bound"], "contention": result["contention"],
              "compute_only": result.get("compute_only"), "best_ddp": result["best_ddp"], "job_s": result["job_s"],
              "peak_rss_bytes": result.get("peak_rss_bytes"), "phases": result.get("phases"),
              "stopping": result.get("stopping"), "load": result.get("load")}
    return [{**row, **shared} for row in result["rows"]]  # type: ignore[typeddict-item]


def _x(ratio: float | None, width: int) -> str:
    return f"{ratio:{width}.2f}x" if ratio is not None else f"{'-':>{width}s} "


def table(result: BenchResult) -> str:
    lines = [f"{'strategy':14s} {'median ms':>10s} {'vs ddp':>7s} {'vs best ddp':>11s} {'/ lower bd':>10s} "
             f"{'predicted ms':>12s} {'error':>7s}"]
    load = result.get("load")
    for r in result["rows"]:
        below = "!" if r.get("below_bound") else " "  # explained under the table
        loaded = "~" if loaded_rounds(load, r.get("warmup_rounds") or 0) else ""  # explained under the table
        lines.append(f"{r['strategy']:14s} {r['iteration_s_median'] * 1e3:10.1f} {_x(r['speedup_vs_ddp'], 6)} "
                     f"{_x(r['speedup_vs_best_ddp'], 10)} {_x(r['vs_lower_bound'], 9)}{below}"
                     f"{r['predicted_iteration_s'] * 1e3:12.1f} {r['prediction_error'] * 100:+6.1f}%{loaded}")
    lb = result["lower_bound"]
    ref = result.get("compute_only")
    if ref:
        lines.append(f"compute only (same steps, no gradients moved, ranks in step) "
                     f"{ref['iteration_s_median'] * 1e3:.1f} ms: the compute the predictions and the bound use")
    lines.append(f"lower bound {lb['lower_bound_s'] * 1e3:.1f} ms (compute {lb['compute_s'] * 1e3:.1f} ms, all "
                 f"gradients all-reduced at the least cost {lb['allreduce_all_s'] * 1e3:.1f} ms, overlapping "
                 f"{lb.get('overlap', 'backward+forward')}); "
                 f"best DDP: {result['best_ddp']}")
    lines += [f"! {r['strategy']} ran below the lower bound ({r['below_bound']['assumption']}), "
              f"{r['below_bound']['reason']}" for r in result["rows"] if r.get("below_bound")]
    lines += _load_lines(load, result["rows"])
    if "contention_bound_s" in lb and lb["contention_bound_s"] > lb["lower_bound_s"] * 1.001:
        best = min(result["rows"], key=lambda r: r["iteration_s_median"])
        cb = lb["contention_bound_s"]
        lines.append(f"lower bound with the measured contention {cb * 1e3:.1f} ms (overlap is not free here); "
                     f"the fastest row, {best['strategy']}, is {best['iteration_s_median'] / cb:.2f}x it")
    lines += _auto_lines(result["rows"]) + _contention_lines(result.get("contention"))
    lines += phase_lines(result.get("phases"), result.get("profile", {}).get("total_bytes"))
    return "\n".join(lines)


def _load_lines(load: Load | None, rows: list[BenchRow]) -> list[str]:
    """Under the table: the rounds whose 1-minute load at their end was above the job's ``loaded_above``
    (:func:`gradsched.jobs.rounds.loaded_rounds`), the rows marked ``~``; nothing where none was."""
    warm = (rows[0].get("warmup_rounds") or 0) if rows else 0
    loaded = loaded_rounds(load, warm)
    if not loaded or load is None:
        return []
    counted = [x for x in load["rounds"][warm:] if x is not None]
    return [f"~ {len(loaded)} of {len(counted)} counted rounds ended with the 1-minute load above "
            f"{load['loaded_above']:g} ({load['ranks']} ranks on {load['cores']} cores: a replay's own ranks keep it "
            f"under {LOADED_SHARE:.0%} of their number); loads {', '.join(f'{x:.1f}' for x in counted)}: the rows' "
            f"times include other work's, and their predictions are not the job's alone"]


def auto_strategy(row: dict[str, Any]) -> str | None:
    """The strategy an ``auto`` row of ``gradsched bench --json`` ran: offline ``auto``'s
    choice, or the plan run-time ``auto`` settled on (its first plan, a trial's, ``torch-ddp``)."""
    opts = row.get("plan_options") or {}
    if "chose" in opts:
        return opts["chose"]
    switches = (row.get("autotune") or {}).get("switches")
    return switches[-1]["strategy"] if switches else None


def _auto_lines(rows: list[BenchRow]) -> list[str]:
    """What run-time or offline ``auto`` chose, if it ran."""
    auto = next((r for r in rows if r["strategy"] == "auto"), None)
    if auto is None:
        return []
    lines: list[str] = []
    opts = auto.get("plan_options") or {}
    tune = auto.get("autotune")
    name, detail = auto_strategy(auto), opts.get("chosen_options") if "chose" in opts else opts
    chose = f"{name} {detail}" if name else str(detail)
    lines.append(f"auto chose {chose} ({auto['operations']} operations)")
    if tune and tune.get("predicted_iteration_s"):
        lines.append(f"  (planned at run time from its own in-training measurements, which predicted "
                     f"{tune['predicted_iteration_s'] * 1e3:.1f} ms; {tune['replans']} re-plan(s))")
    warmup = AutoWarmup.from_dict(dict(auto["auto_warmup"])) if auto.get("auto_warmup") else None
    if warmup is not None and (not warmup.in_situ or warmup.shortened):  # planned at start-up, or a short warm-up
        lines.append(f"  ({warmup.describe()})")
    return lines + _trial_lines((tune or {}).get("trial_decision")) + _late_switch_lines(tune, warmup)


def _late_switch_lines(tune: dict[str, Any] | None, warmup: AutoWarmup | None) -> list[str]:
    """Run-time ``auto``'s plan switches after its in-situ warm-up, so inside the timed rounds (a check that
    re-planned, a revert): the row's median then mixes plans while its prediction is the plan it ended on (runs12's
    ResNet-50: a re-plan and a revert in the counted rounds, -12.1%)."""
    if not tune or warmup is None or not warmup.in_situ:
        return []
    held = tune.get("held_from")  # the checks held from there: the rounds' start (files before it: the warm-up's end)
    late = [s for s in tune.get("switches") or []
            if (s.get("iteration") or 0) >= held] if held is not None else [
        s for s in tune.get("switches") or [] if (s.get("iteration") or 0) > warmup.iterations]
    if not late:
        return []
    when = ", ".join(f"{s.get('reason')} at iteration {s.get('iteration')}" for s in late)
    start = f"its checks held from iteration {held}" if held is not None else \
        f"after its {warmup.iterations}-iteration warm-up"
    return [f"  ! auto switched plans during the rounds ({when}, {start}): "
            f"its median mixes plans, its prediction is the plan it ended on"]


def _trial_lines(decision: TrialDecision | None) -> list[str]:
    """Run-time ``auto``'s trials, fastest first: each plan's label with its planner options (two ``usbyte``
    candidates, grouped or not, differ only there; PyTorch DDP's label names its bucket size) and its median.  Plans
    that share both are told apart by what they were planned on and their operations (the README job's two
    ``usbyte`` ``groups=0`` plans: the measured profile's and the bench's), or, in a record from before those, by
    their hashes."""
    measured = (decision or {}).get("measured") or {}
    if not decision or not measured:
        return []
    plans, options = decision.get("plans") or {}, decision.get("options") or {}

    def named(h: str) -> str:
        label, opts = plans.get(h, h), options.get(h)
        if not opts or label.startswith(TORCH_DDP):
            return label
        return f"{label} ({', '.join(f'{k}={v}' for k, v in sorted(opts.items()))})"

    names = {h: named(h) for h in measured}
    shared = {n for n in names.values() if list(names.values()).count(n) > 1}
    planned_on, operations = decision.get("planned_on") or {}, decision.get("operations") or {}

    def told_apart(h: str) -> str:
        if names[h] not in shared:
            return names[h]
        if h not in planned_on:
            return f"{names[h]} [plan {h[:8]}]"
        on = "at start-up" if planned_on[h] == "start-up" else f"on the {planned_on[h]} profile"
        return f"{names[h]} [planned {on}, {operations.get(h, '?')} operations]"

    return ["  trials (median ms): " + "; ".join(
        f"{told_apart(h)} {s * 1e3:.1f}{' kept' if h == decision.get('kept') else ''}"
        for h, s in sorted(measured.items(), key=lambda x: x[1]))]


def _contention_lines(c: Contention | None) -> list[str]:
    """The probe's figures, pooled ones and runtime costs, if the job probed."""
    if not c:
        return []
    lines: list[str] = []
    own = c.get("own_fitted", c["fitted"])  # this job's probe; `fitted` is what predictions use
    lines.append(f"contention: a step {c['compute_alone_s'] * 1e3:.0f} ms alone, "
                 f"{c['compute_overlapped_s'] * 1e3:.0f} ms behind all-reduces (x{c['compute_slowdown']:.2f}); "
                 f"an all-reduce {c['allreduce_alone_s'] * 1e3:.1f} ms alone "
                 f"({c.get('allreduce_model_s', c['allreduce_alone_s']) * 1e3:.1f} ms in the cost model), "
                 f"{c['allreduce_overlapped_s'] * 1e3:.1f} ms while steps run "
                 f"(x{1 + own.get('comm_slowdown', 0.0):.2f} the cost model); "
                 f"{own.get('busy_latency_s', 0.0) * 1e3:.2f} ms more per operation started during compute, "
                 f"{own.get('op_latency_s', 0.0) * 1e3:.2f} ms more per operation in any case")
    if c.get("history"):
        f = c["fitted"]
        lines.append(f"  predicted with each figure at its median over this job and {len(c['history'])} earlier "
                     f"(--contention-from): compute {f['compute_slowdown']:.2f}, communication "
                     f"{f['comm_slowdown']:.2f}, {f['busy_latency_s'] * 1e3:.2f} and "
                     f"{f['op_latency_s'] * 1e3:.2f} ms per operation")
    if "bucket_copy_s" in c:
        lines.append(f"runtime costs per step: bucket passes over all gradients {c['bucket_copy_s'] * 1e3:.1f} ms "
                     f"(copy) + {c['bucket_scale_s'] * 1e3:.1f} ms (scale); buffer broadcast "
                     f"{c.get('buffer_sync_s', 0.0) * 1e3:.1f} ms")
    if c.get("runtime_overhead_s"):
        lines.append("runtime overhead per step (a step of its simplest plan beyond the simulated one): " + ", ".join(
            f"{name} {seconds * 1e3:.1f} ms" for name, seconds in c["runtime_overhead_s"].items()))
    if c.get("op_host"):
        lines.append(f"gradsched's host time per operation: {c['op_host']['issue_s'] * 1e3:.3f} ms to issue, "
                     f"{c['op_host']['retire_s'] * 1e3:.3f} ms to retire (wfbp against sync, thread CPU time)")
    if c.get("resamples"):
        lines.append(f"these figures and the network table's sizes up to 4 MiB: medians over the start-up "
                     f"measurement and {c['resamples']} samples between rounds ({c['resample_s']:.1f} s); "
                     f"the plans were made from the start-up ones")
    return lines


def plot(result: BenchResult, path: str, title: str) -> None:
    from gradsched.plot import bars

    rows = result["rows"]
    bars([r["strategy"] for r in rows], [r["iteration_s_median"] * 1e3 for r in rows], path,
         ylabel="median iteration (ms)", title=title, reference=result["lower_bound"]["lower_bound_s"] * 1e3)


def run(args: argparse.Namespace) -> int:
    rate = _network(args)
    replay = args.replay is not None
    scale, note = bench_rules.byte_scale(args.replay, args.hosts * args.ranks_per_host, args.scale_bytes,
                                           rate is not None, bench_rules.runs_two_phase(_checked_entries(args)))
    if note:  # the byte scale it picked
        print(note, file=sys.stderr)
    shaped = shaped_rate(rate, args.hosts, args.dilate, replay, scale)
    network = f"testbed {rate}" if rate else "loopback"
    name = f"replay:{args.replay}" if replay else args.model
    history = contention_history(args.contention_from, bench_rules.history_job(
        name, args.hosts, args.ranks_per_host, network, rate, args.batch_size, args.dilate if replay else None))
    # SIGTERM: the folder removed too, the workers stopped, one line said
    with sigterm_unwinds("gradsched bench"), tempfile.TemporaryDirectory(prefix="gradsched-bench-") as tmp:
        model, trimmed = args.model, None
        if replay:
            model, given = replay_model(args.replay, args.dilate, tmp, scale)
            trimmed = _trim(args, history, given, rate)
        cfg = _config(args, tmp, history, model, scale, trimmed)
        cfg_path = Path(tmp, "config.json")
        cfg_path.write_text(json.dumps(cfg.to_dict()))
        _launch(cfg_path, args.hosts, shaped, args.timeout_s, args.prefix, args.ranks_per_host)
        out = Path(tmp, "bench.json")
        if not out.exists():
            raise GradschedError("the benchmark's workers exited without writing results; see their output above")
        result = bench_rules.finish(json.loads(out.read_text()), cfg.dilate)
    trimmed, steps = _fitted(args, result, trimmed, cfg.steps)
    meta = _meta(args, scale, name, network, rate)
    if trimmed is not None and trimmed.cut:
        meta["trimmed"] = {**trimmed.to_dict(), **result.get("trimmed", {})}
    meta["steps_per_round"] = steps
    _report(args, result, meta, _title(args, network), scale, steps, trimmed)
    return 0


def _fitted(args: argparse.Namespace, result: BenchResult, before: Trim | None, steps: int) -> tuple[Trim | None, int]:
    """What the rounds ran: the workers' fit after start-up where they made one (``result["trimmed"]``, with
    the fit before the launch as its ``before_launch`` where that cut; ``args.rounds`` set to its rounds), else
    ``before``; and the steps per round."""
    after = result.get("trimmed")
    if not after:
        return before, steps
    if before is not None and before.cut:
        after["before_launch"] = before.to_dict()
    args.rounds = after["rounds"]
    out = Trim.from_dict(dict(after))
    return out, out.steps


def _trim(args: argparse.Namespace, history: list[dict[str, float]], profile: Any, rate: str | None) -> Trim | None:
    """A replay's rows and steps cut to fit :data:`BENCH_TARGET_S` (:func:`gradsched.jobs.budget.trim`), on the
    testbed only (on loopback the links' time is not known); printed before the workers start."""
    from gradsched.jobs import budget
    from gradsched.testbed import parse_rate_bps

    if rate is None:
        return None
    _check_args(args, history)
    step_s = budget.step_estimate_s(profile.compute_s, profile.total_bytes, args.hosts * args.ranks_per_host,
                                    parse_rate_bps(rate), args.dilate)
    out = budget.trim(_checked_entries(args), profile.total_bytes, step_s, steps=args.steps,
                      buckets_given=args.ddp_buckets is not None, warmup_rounds=args.warmup_rounds,
                      min_rounds=args.min_rounds, default_steps=DEFAULT_STEPS, default_rounds=DEFAULT_ROUNDS,
                      rounds=None if getattr(args, "rounds_default", False) else args.rounds)
    if out.cut:
        args.rounds = out.rounds
    for line in out.lines(DEFAULT_BUCKETS, DEFAULT_STEPS, DEFAULT_ROUNDS):
        print(line, file=sys.stderr)
    return out


def _meta(args: argparse.Namespace, scale: int, name: str, network: str, rate: str | None) -> dict[str, Any]:
    """The run's facts, in every JSON row."""
    return {"scale_bytes": scale, "model": name, "hosts": args.hosts, "ranks_per_host": args.ranks_per_host,
            "network": network, "rate": rate, "dilate": args.dilate,
            "compute": "emulated (replayed profile, waiting)" if args.replay is not None else "real (CPU)",
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "steps_per_round": args.steps, "rounds": args.rounds, "batch_size": args.batch_size,
            "command": " ".join(["gradsched bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else "gradsched bench"}


def _report(args: argparse.Namespace, result: BenchResult, meta: dict[str, Any], title: str, scale: int,
            steps: int, trimmed: Trim | None = None) -> None:
    """The table (on stderr with ``--json -``), the JSON and the plot."""
    report = sys.stderr if to_stdout(args) else sys.stdout  # stdout carries the JSON alone with --json -
    stop = result.get("stopping")
    run = stop["rounds_run"] if stop else args.rounds
    early = (f" (of at most {args.rounds - args.warmup_rounds}: the last moved no row's median by more than "
             f"{stop['tol']:.1%})" if stop and stop["stopped_early"] else "")
    print(f"{title}: {run - args.warmup_rounds} counted rounds x {steps} steps{early}, batch {args.batch_size}",
          file=report)
    print(table(result), file=report)
    for line in trimmed.lines(DEFAULT_BUCKETS, DEFAULT_STEPS, DEFAULT_ROUNDS) if trimmed is not None else []:
        print(line, file=report)
    if scale > 1:
        print(_scale_line(scale), file=report)
    emit_json(args, rows_for_json(result, meta))
    if args.plot:
        plot(result, args.plot, title)
        print(f"wrote {args.plot}")


def _scale_line(scale: int) -> str:
    return (f"byte scaling {scale}: every tensor 1/{scale} of its elements on links at rate/{scale}, so each "
            f"operation's bandwidth time is the emulated one; per-message latency is not scaled (it weighs "
            f"{scale}x more against the bytes than in the cluster emulated); every size given or used (DDP's "
            f"bucket caps, the planners' options, auto's candidates) was divided by {scale} too, but PyTorch DDP's "
            f"own 1 MiB first bucket; sizes above are the scaled ones")


def _title(args: argparse.Namespace, network: str) -> str:
    hosts = f"{args.hosts} hosts"
    if args.ranks_per_host > 1:
        hosts += f" x {args.ranks_per_host} ranks ({args.hosts * args.ranks_per_host} ranks)"
    if args.replay is None:
        return f"{args.model}, {hosts}, {network} (gloo, CPU)"
    dilated = f" (dilation {args.dilate:g})" if args.dilate != 1 else ""
    name = Path(args.replay).stem.removesuffix(".profile")
    return f"{name} replayed, {hosts}, {network}{dilated} (emulated compute)"
