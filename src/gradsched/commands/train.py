"""``gradsched train``: data-parallel training of a built-in model (or your own) on N local workers.

Starts ``--workers`` ranks on loopback with PyTorch's own launcher
(``torch.distributed.run``), trains ``--model`` (a built-in one on synthetic data, or
your factory ``MODULE:FUNCTION``) under ``--strategy`` (``ddp`` is PyTorch's DDP
itself), and prints a summary; ``--json [PATH]`` writes the result as one JSON object
(``-``: on stdout, instead of the summary).  ``--strategy auto`` profiles in situ, switches to the plan it
predicts fastest (``--opt switch_iteration=5``) and adds ``predicted_iteration_s``
(and the median measured after its last switch) to the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gradsched._signals import sigterm_unwinds
from gradsched._validate import timeout_s
from gradsched.commands._inputs import check_processes
from gradsched.commands._model import BUILT_IN, check_model
from gradsched.commands._model import HELP as MODEL_HELP
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.commands._workers import failure_report, printer
from gradsched.errors import GradschedError, WorkersFailed
from gradsched.jobs.config import TrainConfig
from gradsched.jobs.launch import PREFIXES
from gradsched.jobs.results import TrainResult
from gradsched.options import check
from gradsched.sparsity import DENSITY
from gradsched.tuning.config import PLANNER_KEYS

MODELS = BUILT_IN
LOG_ENV = "GRADSCHED_LOG_LEVEL"  # set by --log-level (gradsched.cli); the workers log at that level
AUTO_PLANNER_KEYS = PLANNER_KEYS + ("density",)  # run-time auto's options that its planner takes
TESTBED_PREFIX = PREFIXES["train"]  # its own prefix: never touches a testbed the user brought up
WORKER = "gradsched.torch.jobs.trainer"  # what each rank runs: python -m WORKER config.json


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("train", help="train a built-in model on N local workers under a strategy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", "--nproc", dest="nproc", type=int, default=2, metavar="N",
                   help="data-parallel ranks, one process each: on this machine, or one per testbed host with --rate "
                        "(default 2; --nproc is the same flag)")
    p.add_argument("--model", default="mlp", help=f"{MODEL_HELP} (default mlp)")
    p.add_argument("--strategy", default="wfbp", help="strategy name (default wfbp); ddp = PyTorch DDP")
    p.add_argument("--plan", default=None, help="run this plan file (gradsched.plan/1) instead of --strategy")
    p.add_argument("--opt", "--option", dest="option", action="append", default=[], metavar="KEY=VALUE",
                   help="strategy option, repeatable (e.g. --opt mb=4 with --strategy threshold); --option is the "
                        "old spelling")
    p.add_argument("--density", type=float, default=None,
                   help="top-k density for --strategy topk|omgs (default 0.001) or auto (allows sparse plans)")
    p.add_argument("--sparse", action="append", default=[], metavar="KEY=VALUE",
                   help="top-k runtime option, repeatable: warmup_steps=N, selection=exact|sampled, "
                        "error_feedback=false, memory=laysa|naive (docs/sparse.md)")
    p.add_argument("--profile", default=None, help="plan with this measured profile (default: sizes from the model)")
    p.add_argument("--cluster", default=None, help="plan with this measured cluster (default: loopback-like)")
    p.add_argument("--no-torch-ddp", action="store_true",
                   help="with --strategy ddp: run the ddp planner's buckets on gradsched's executor")
    p.add_argument("--rate", default=None, help="run each worker on its own testbed host with links shaped to this "
                   "rate (e.g. 1gbit; needs root; see docs/testbed.md) instead of loopback")
    p.add_argument("--prefix", default=TESTBED_PREFIX, help=f"testbed name prefix with --rate (default "
                   f"{TESTBED_PREFIX}); a testbed of that prefix must not exist: this job brings up its own")
    p.add_argument("--ranks-per-host", type=int, default=1, metavar="M",
                   help="with --rate: M of the --workers ranks on each testbed host (--workers / M hosts; default 1), "
                        "talking over its loopback inside a host and over the shaped links across hosts")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the timing, 0 to --steps - 1 (default 3, or --steps - 1 if fewer)")
    p.add_argument("--batch-size", type=int, default=16, help="per-worker batch size (default 16)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 0.01 sgd, 1e-3 adam)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl with GPUs, else gloo")
    p.add_argument("--threads", type=int, default=1, help="compute threads per worker (default 1)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout (default 300)")
    p.add_argument("--save-params", default=None, metavar="PATH", help="torch.save rank 0's final parameters here")
    p.add_argument("--trace", default=None, metavar="OUT.json", help="write the measured Chrome trace of all ranks")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines while training (they go to stderr: --json - keeps stdout clean)")
    add_json_arg(p, "the result, one object,")
    p.set_defaults(func=run)


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise GradschedError(f"--opt {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _checked(strategy: str, options: dict[str, Any]) -> dict[str, Any]:
    """``--opt`` values of ``strategy``, typed and range-checked here, not in a worker's traceback."""
    from gradsched.planners.registry import check_options

    mine = options if strategy != "auto" else {k: x for k, x in options.items() if k in AUTO_PLANNER_KEYS}
    try:
        checked = check_options(strategy, mine)
    except GradschedError as exc:
        raise GradschedError(f"--opt: {exc}") from None
    checked = {k: list(x) if isinstance(x, tuple) else x for k, x in checked.items()}  # JSON for the workers
    if strategy == "auto":
        from gradsched.torch.runtime.autotune import AutoTuneConfig

        checked = {**options, **checked}
        AutoTuneConfig.from_options(checked)  # run-time auto's own settings
    return checked


def _config(args: argparse.Namespace, out_dir: str) -> TrainConfig:
    check_processes("--workers", args.nproc)
    if args.steps < 1 or args.batch_size < 1 or args.threads < 1:
        raise GradschedError("--steps, --batch-size and --threads must be at least 1")
    if args.warmup is None:
        args.warmup = min(3, args.steps - 1)
    if not 0 <= args.warmup < args.steps:
        raise GradschedError(f"--warmup must be between 0 and --steps - 1 ({args.steps - 1}): the steps left out of "
                             f"the timing, got {args.warmup}")
    args.timeout_s = timeout_s(args.timeout_s, "--timeout-s")  # as the runtime's timeout_s: one declaration
    if args.lr is not None and not 0 < args.lr < float("inf"):
        raise GradschedError(f"--lr must be a finite number above 0, got {args.lr}")
    check_model(args.model, seed=args.seed, batch_size=args.batch_size)
    _check_files(args)
    if not args.plan:
        from gradsched.planners import get_planner, is_sparse

        get_planner(args.strategy)  # unknown name: error listing the known ones
        if args.density is not None and not (is_sparse(args.strategy) or args.strategy == "auto"):
            raise GradschedError(f"--density applies to sparse strategies (topk, omgs) and auto, not to "
                                 f"{args.strategy!r}")
    if args.density is not None:
        args.density = check("--density", DENSITY, args.density)  # in (0, 1]: the one declaration
    plan_options = _options(args.option)
    if args.density is not None:
        plan_options["density"] = args.density
    if plan_options and not args.plan:
        plan_options = _checked(args.strategy, plan_options)
    sparse_options = _options(args.sparse)
    if sparse_options:
        from gradsched.torch.runtime.sparse import SparseOptions

        SparseOptions.of(sparse_options)  # bad keys or values: one line here, not a worker traceback
    lr = args.lr if args.lr is not None else (0.01 if args.optimizer == "sgd" else 1e-3)
    absolute = lambda p: str(Path(p).resolve()) if p else None  # noqa: E731
    return TrainConfig(model=args.model, strategy=args.strategy, plan_path=absolute(args.plan),
                       profile_path=absolute(args.profile), cluster_path=absolute(args.cluster),
                       plan_options=plan_options, sparse_options=sparse_options or None,
                       no_torch_ddp=args.no_torch_ddp, steps=args.steps,
                       warmup=args.warmup, batch_size=args.batch_size, optimizer=args.optimizer, lr=lr,
                       seed=args.seed, backend=args.backend, threads=args.threads, timeout_s=args.timeout_s,
                       save_params=absolute(args.save_params), trace_path=absolute(args.trace), out_dir=out_dir,
                       progress=not getattr(args, "quiet", False))


def _check_files(args: argparse.Namespace) -> None:
    """--plan, --profile and --cluster read here, once: a missing, unreadable or malformed file (a pipe,
    /dev/zero, a UTF-16 export) is one line now, not a traceback (or a hang) in every worker."""
    from gradsched.cluster import Cluster
    from gradsched.plan import Plan
    from gradsched.profile import Profile

    for flag, path, cls in (("--plan", args.plan, Plan), ("--profile", args.profile, Profile),
                            ("--cluster", args.cluster, Cluster)):
        if path:
            try:
                cls.load(path)
            except GradschedError as exc:
                raise GradschedError(f"{flag} {exc}") from None


def launch(cfg: TrainConfig, nproc: int, *, worker_log: bool = False, rate: str | None = None,
           ranks_per_host: int = 1, prefix: str | None = None) -> tuple[int, str]:
    """Run ``nproc`` workers (on loopback, or ``ranks_per_host`` per testbed host with links shaped to ``rate``;
    the testbed is always torn down); return (exit code, the last lines of their combined output).  Progress
    lines (``cfg.progress``) and, with ``worker_log``, the workers' log go to stderr as they come."""
    from gradsched.jobs.launch import Ranks
    from gradsched.jobs.launch import launch as launch_ranks

    hosts = nproc
    if rate is not None:
        from gradsched.testbed import check_ranks_per_host

        if os.geteuid() != 0:
            raise GradschedError("--rate runs workers on the testbed, which needs root; drop --rate to use loopback")

        if nproc % check_ranks_per_host(ranks_per_host):
            raise GradschedError(f"--workers {nproc} is not a whole number of hosts of --ranks-per-host "
                                 f"{ranks_per_host}")
        hosts = nproc // ranks_per_host
    cfg_path = Path(cfg.out_dir, "config.json")
    cfg_path.write_text(json.dumps(cfg.to_dict()))
    # the collectives' own timeout (cfg.timeout_s) ends a hung job: training has no wall-clock limit
    ranks = Ranks.of(WORKER, cfg_path, hosts=hosts if rate is not None else 1,
                     ranks_per_host=ranks_per_host if rate is not None else nproc, rate=rate,
                     prefix=prefix or TESTBED_PREFIX, threads=cfg.threads)
    done = launch_ranks(ranks, printer(progress=cfg.progress, worker_log=worker_log))
    return done.code, "\n".join(done.tail)


def launch_testbed(cfg: TrainConfig, nproc: int, rate: str, ranks_per_host: int = 1,
                   prefix: str | None = None) -> tuple[int, str]:
    """:func:`launch` on the testbed (the old entry point)."""
    return launch(cfg, nproc, rate=rate, ranks_per_host=ranks_per_host, prefix=prefix)


def run(args: argparse.Namespace) -> int:
    # SIGTERM unwinds: the workers are stopped and the folder removed (it leaked gradsched-train-* before)
    with sigterm_unwinds("gradsched train"), tempfile.TemporaryDirectory(prefix="gradsched-train-") as tmp:
        cfg = _config(args, tmp)
        if args.ranks_per_host != 1 and not args.rate:
            raise GradschedError("--ranks-per-host places ranks on testbed hosts: give --rate (as root)")
        worker_log = bool(os.environ.get(LOG_ENV))  # --log-level: the workers' log (run-time auto's decisions)
        code, output = launch(cfg, args.nproc, worker_log=worker_log, rate=args.rate,
                              ranks_per_host=args.ranks_per_host, prefix=args.prefix)
        result_path = Path(tmp, "result.json")
        if code != 0 or not result_path.exists():
            detail, summary = failure_report(tmp, code, output.splitlines())
            print("\n".join(detail), file=sys.stderr)
            raise WorkersFailed(f"training failed {summary}", code)
        result: TrainResult = json.loads(result_path.read_text())
    if to_stdout(args):
        emit_json(args, result, indent=None)
        return 0
    print_report(result)
    emit_json(args, result, indent=None)
    return 0


def print_report(result: TrainResult) -> None:
    """The human-readable summary of a finished job (``result``: rank 0's result JSON)."""
    ops = f"{result['operations']} operations" if result["operations"] is not None else "PyTorch DDP"
    print(f"{result['model']} ({result['params']:,} parameters), {result['nproc']} x {result['backend']}, "
          f"strategy {result['strategy']} ({ops})")
    print(f"  {result['steps']} steps of batch {result['batch_size']} per worker, {result['optimizer']}")
    print(f"  iteration: median {result['iteration_s_median'] * 1e3:.1f} ms, mean {result['iteration_s_mean'] * 1e3:.1f} ms"
          f" (first {result['warmup_steps']} steps not counted)")
    if result.get("autotune"):
        _print_deferred(result["autotune"], result["steps"])
        for sw in result["autotune"]["switches"][1:]:  # (deferred profiling's switch has no prediction)
            print(f"  auto: iteration {sw['iteration']}: {sw['strategy']} ({sw['reason']}), predicted "
                  f"{_ms(sw['predicted_iteration_s'])}, measured before {_ms(sw['measured_before_s'])}")
        if result.get("predicted_iteration_s") is not None and result.get("measured_iteration_s_after_switch"):
            print(f"  auto: predicted {result['predicted_iteration_s'] * 1e3:.1f} ms, measured after the last switch "
                  f"{result['measured_iteration_s_after_switch'] * 1e3:.1f} ms (median)")
    print(f"  loss: {result['loss_first']:.4f} -> {result['loss_last']:.4f}")
    if result.get("peak_extra_bytes") is not None:
        print(f"  peak extra memory (runtime buffers beyond parameters and optimizer state): "
              f"{result['peak_extra_bytes'] / 2**20:.2f} MiB")
    if result.get("saved_params"):
        print(f"  parameters of rank 0 saved to {result['saved_params']}")
    if result.get("trace"):
        print(f"  measured trace of all ranks: {result['trace']}")


def _print_deferred(tuner: dict, steps: int) -> None:
    """Where run-time auto never profiled: that PyTorch's DDP ran throughout, and why."""
    if tuner.get("profiled_at") is not None or tuner.get("profiling_from") is None:
        return
    print(f"  auto: ran PyTorch's DDP throughout: at this job's speed, profiling would pay for itself from "
          f"iteration {tuner['profiling_from']:,} (this job: {steps:,} steps; --opt defer=false profiles at once, "
          f"docs/autotune.md)")


def _ms(seconds: float | None) -> str:
    """``seconds`` in milliseconds for the report, ``-`` where there is none."""
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"
