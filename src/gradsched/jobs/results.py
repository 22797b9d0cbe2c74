"""What the workers hand back, typed, and the one conversion from run seconds to emulated seconds.

A dilated replay (``gradsched bench --replay P --dilate K``) runs K times slower than the
cluster it emulates: compute waits K times its profile, links are shaped at rate / K.  The
workers measure in *run seconds* (what their clocks say); the user reads *emulated
seconds* (run seconds / K).  Each field below says which it is where it is declared:

- ``Emulated[...]``: a duration of the run, divided by K once, by :func:`to_emulated`;
- everything else is kept: ratios, counts, names, and the job's own durations
  (``job_s``, ``resample_s``, ``phases``), and the measured profile and cluster, which stay
  in run seconds (``dilate`` in the result says by how much they are stretched).

Figures read back from an earlier job's JSON (``--contention-from``) are emulated seconds;
:func:`contention_to_run` takes them into run seconds before the workers pool them with
their own.  No key name is parsed: a field the types do not declare is listed by
:func:`undeclared` (a test keeps that list empty), never converted by guess.

Why TypedDicts here, where the configs (:mod:`gradsched.jobs.config`) are dataclasses with
``to_dict``/``from_dict``: a result *is* its JSON, the file format users keep and scripts
read (``benchmarks/results/*.json``), nested and partly open (a planner's options, the
measured profile and cluster); a TypedDict types that JSON as it is, with no second shape
to keep in step, and :func:`undeclared` checks every stored file against the declarations.

Torch-free: the command reads and converts; the workers only fill the fields.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, TypedDict, Union

from gradsched.errors import GradschedError

EMULATED = "emulated seconds"  # the mark: a duration of the run, divided by the dilation
OPEN = "open"  # the mark of a dict whose other keys are someone else's (a planner's options)
T = typing.TypeVar("T")
Emulated = Annotated[T, EMULATED]


class Fitted(TypedDict, total=False):
    """The contention figures the simulator reads (gradsched.cluster.CONTENTION_FIELDS)."""

    compute_slowdown: float
    comm_slowdown: float
    busy_latency_s: Emulated[float]
    op_latency_s: Emulated[float]
    reducescatter_comm_slowdown: float  # where the job runs two-phase rows (probe.phase_slowdowns)
    allgather_comm_slowdown: float


class OpHost(TypedDict, total=False):
    issue_s: Emulated[float]
    retire_s: Emulated[float]


class ProbeSamples(TypedDict, total=False):
    compute_alone_s: Emulated[list[float]]
    allreduce_alone_s: Emulated[list[float]]
    compute_overlapped_s: Emulated[list[float]]
    allreduce_overlapped_s: Emulated[list[float]]
    small_ops_alone_s: Emulated[list[float]]
    small_ops_busy_s: Emulated[list[float]]
    reducescatter_alone_s: Emulated[list[float]]  # where the job runs two-phase rows
    reducescatter_overlapped_s: Emulated[list[float]]
    allgather_alone_s: Emulated[list[float]]
    allgather_overlapped_s: Emulated[list[float]]


class Contention(TypedDict, total=False):
    """The contention probe's figures (``contention`` in the bench's JSON), None with ``--no-probe``."""

    compute_alone_s: Emulated[float]
    allreduce_alone_s: Emulated[float]
    compute_overlapped_s: Emulated[float]
    allreduce_overlapped_s: Emulated[float]
    small_ops_alone_s: Emulated[float]
    small_ops_busy_s: Emulated[float]
    compute_slowdown: float
    allreduce_slowdown: float
    reducescatter_alone_s: Emulated[float]  # where the job runs two-phase rows: the same bytes' reduce-scatter
    reducescatter_overlapped_s: Emulated[float]  # (as the runtime runs it) and all-gather, alone and while
    allgather_alone_s: Emulated[float]  # steps run, and their ratios
    allgather_overlapped_s: Emulated[float]
    reducescatter_slowdown: float
    allgather_slowdown: float
    allreduce_bytes: int
    allreduce_model_s: Emulated[float]
    allreduce_anchor: float  # the factor on the table's bandwidth term that put it through allreduce_alone_s
    reps: int
    small_ops: int
    small_ops_model_s: Emulated[float]
    samples: ProbeSamples
    fitted: Fitted  # what the predictions use (pooled over --contention-from's jobs)
    own_fitted: Fitted  # this job's own, with --contention-from
    startup_fitted: Fitted
    history: list[Fitted]  # the earlier jobs' (--contention-from)
    startup_reps: int
    startup_anchor: float  # the all-reduce table's bandwidth term x this before planning (anchored_to_probe)
    bucket_copy_s: Emulated[float]
    bucket_scale_s: Emulated[float]
    buffer_sync_s: Emulated[float]
    host_work_hidden: bool
    op_host: OpHost
    startup_op_host: OpHost
    op_host_samples: Emulated[list[list[float]]]  # per rotation: (issue_s, retire_s)
    update_call_s: Emulated[float]  # one deferred update of an overlapping plan, every rank at it (op_host.update_call_s)
    runtime_overhead_s: Emulated[dict[str, float]]  # per runtime ("gradsched", "torch DDP")
    startup_runtime_overhead_s: Emulated[dict[str, float]]
    resamples: int  # the contention probe's samples between the rounds
    resamples_each: dict[str, int]  # each sampler's (network, contention, overheads): each on its own budget
    resample_s: float  # the job's own time spent resampling


class Switch(TypedDict, total=False):
    iteration: int
    strategy: str
    plan_hash: str
    predicted_iteration_s: Emulated[float | None]
    measured_before_s: Emulated[float | None]
    reason: str


class Check(TypedDict, total=False):
    iteration: int
    measured_s: Emulated[float]
    predicted_s: Emulated[float]
    expected_s: Emulated[float]
    replan: bool
    action: str  # keep, replan, revert, or control: a control plan measured beside it (shared drift: kept)


class TrialDecision(TypedDict, total=False):
    measured: Emulated[dict[str, float]]  # per plan hash
    rounds: Emulated[dict[str, list[float]]]
    baseline: str | None
    kept: str | None
    resized: list[str]
    plans: dict[str, str]  # per plan hash: its label (strategy; PyTorch DDP's with its bucket size)
    options: dict[str, dict[str, Any]]  # per plan hash: the planner options that made it (autotune.trial_options)
    planned_on: dict[str, str]  # per plan hash: "measured", "given" or "start-up" (autotune.planned_on)
    operations: dict[str, int]  # per plan hash: its operations
    runoff: list[Any]
    paired: dict[str, Any]
    dropped: list[str]
    cost_s: Emulated[float]


class Autotune(TypedDict, total=False):
    """Run-time ``auto``'s summary (gradsched.torch.runtime.autotune.AutoTuner.summary)."""

    predicted_iteration_s: Emulated[float | None]
    expected_iteration_s: Emulated[float | None]
    settled_at: int | None
    profiling_from: int | None  # iterations (AutoTuner.summary), not seconds
    profiled_at: int | None
    measured_iteration_s: Emulated[float | None]
    replans: int
    held_from: int | None  # iteration from which checks were held (the bench's counted rounds), None: never
    trial_decision: TrialDecision | None
    switches: list[Switch]
    checks: list[Check]


class BelowBound(TypedDict):
    assumption: str
    reason: str


class PlanOptions(TypedDict, total=False):
    """A gradsched row's plan options: the planner's own (open), and what offline ``auto`` and ``dear`` add."""

    predicted_iteration_s: Emulated[float]
    chose: str
    chosen_options: dict[str, Any]
    candidates: int


class AutoWarmupRecord(TypedDict, total=False):
    """How a bench's run-time ``auto`` row got its plan (:class:`gradsched.jobs.startup.AutoWarmup`): the
    job's own seconds, as ``phases``."""

    mode: str
    estimated_s: float
    budget_s: float | None  # None: the user set adaptive
    iterations: int
    shortened: dict[str, Any]  # the short warm-up's settings (gradsched.jobs.startup.SHORT_WARMUP), where it ran
    start: dict[str, Any]  # the plan its profiling ran (gradsched.jobs.startup.replay_start: a replay's)


class BenchRow(TypedDict, total=False):
    """One strategy or DDP bucket size of ``gradsched bench`` (the JSON adds the run's facts to each)."""

    strategy: str
    runs: str  # "torch DDP" or "gradsched"
    iteration_s_median: Emulated[float]
    iteration_s_mean: Emulated[float]
    predicted_iteration_s: Emulated[float]
    prediction_error: float
    lower_bound_s: Emulated[float]
    vs_lower_bound: float
    contention_bound_s: Emulated[float]
    vs_contention_bound: float
    operations: int
    plan_hash: str
    step_s: Emulated[list[list[float]]]  # per round, per step
    warmup_rounds: int
    bucket_cap_mb: float
    plan_options: Annotated[PlanOptions, OPEN]
    autotune: Autotune
    auto_warmup: AutoWarmupRecord  # an auto row of a replay: tuned at run time or planned at start-up
    speedup_vs_ddp: float | None
    speedup_vs_best_ddp: float | None
    below_bound: BelowBound | None


class ProfileSummary(TypedDict, total=False):
    compute_s: Emulated[float]
    forward_s: Emulated[float]
    backward_s: Emulated[float]
    other_s: Emulated[float]
    total_bytes: int
    tensors: int
    hooked_compute_s: Emulated[float]
    planned_compute_s: Emulated[float]
    measured: dict[str, Any]  # the profile as measured (gradsched.profile/1), in run seconds


class LowerBound(TypedDict, total=False):
    lower_bound_s: Emulated[float]
    compute_s: Emulated[float]
    allreduce_all_s: Emulated[float]
    compute_bound_s: Emulated[float]
    network_bound_s: Emulated[float]
    contention_bound_s: Emulated[float]
    overlap: str


class ComputeOnly(TypedDict, total=False):
    iteration_s_median: Emulated[float]
    step_s: Emulated[list[list[float]]]


class Phase(TypedDict, total=False):
    phase: str
    s: float  # the job's own time
    peak_rss_bytes: int
    rss_file_bytes: int  # RssFile at the phase's end (shared libraries' pages, part of the peak); absent in older files


class Stopping(TypedDict, total=False):
    """How the rounds ended (:meth:`gradsched.jobs.rounds.StoppingRule.record`): ratios and counts only."""

    rule: str
    tol: float
    min_counted: int
    max_rounds: int
    rounds_run: int
    moves: list[float]  # after each counted round from the second: the largest relative move of a row's median
    stopped_early: bool


class Load(TypedDict, total=False):
    """The machine's 1-minute load average through the job (:class:`gradsched.jobs.rounds.RoundLoads`): a count of
    tasks, not a duration; None where ``/proc/loadavg`` could not be read."""

    source: str  # "/proc/loadavg, 1-minute"
    startup_end: float | None  # as the rounds begin (rows built, run-time auto's warm-up done)
    rounds: list[float | None]  # at each round's end, warm-up rounds included (the rows' step_s rounds)
    ranks: int  # the job's ranks on the machine, and its cores: what loaded_above is taken from
    cores: int
    loaded_above: float  # a round whose load at its end is above this ran beside others' work (rounds.loaded_above)


class Trimmed(TypedDict, total=False):
    """A replay's default rounds cut to fit its wall-time target (:meth:`gradsched.jobs.budget.Trim.to_dict`):
    wall seconds (the job's own time, not emulated) and counts."""

    step_estimate_s: float
    estimate_before_s: float
    estimate_s: float
    target_s: float
    dropped: list[str]  # row labels
    steps: int
    warmup_steps: int
    rounds: int
    duplicates: list[str]  # of the dropped, the rows the same as ddp-all
    steps_cut: bool
    rounds_cut: bool
    at: str  # "start-up": fitted again by the workers with what the start-up measured (absent: before the launch)
    before_launch: dict[str, Any]  # the command's fit before the launch, from the model's step (where it cut)


class BenchResult(TypedDict, total=False):
    """What rank 0 writes (``bench.json``) and the command reports, one row per entry."""

    rows: list[BenchRow]
    profile: ProfileSummary
    compute_only: ComputeOnly
    cluster: dict[str, Any]  # the cluster as measured (gradsched.cluster/1), in run seconds
    lower_bound: LowerBound
    contention: Contention | None
    best_ddp: str | None
    world_size: int
    backend: str
    machine: str
    peak_rss_bytes: int | None
    phases: list[Phase]
    stopping: Stopping  # when the rounds stopped, and by which rule
    load: Load  # the 1-minute load at start-up's end and each round's end; absent in older files
    job_s: float  # the job's own duration
    dilate: float  # present when the times were converted (dilation other than 1)
    trimmed: Trimmed  # a replay on the testbed: the rows, steps and rounds fitted to the budget after start-up


UNITS = "gradsched.jobs.results/1"  # a bench JSON row's ``units``: each duration in the unit declared here


class BenchJsonRow(BenchRow, total=False):
    """One object of ``gradsched bench --json`` (a list of them): a :class:`BenchRow` with the job's
    facts (:class:`BenchResult`'s, the same in every row) and the command line's (``_meta``)."""

    world_size: int
    backend: str
    machine: str
    profile: ProfileSummary
    cluster: dict[str, Any]  # in run seconds
    lower_bound: LowerBound
    contention: Contention | None
    compute_only: ComputeOnly | None
    best_ddp: str | None
    job_s: float
    peak_rss_bytes: int | None
    phases: list[Phase] | None
    stopping: Stopping | None  # absent in files from before the stopping rule
    load: Load | None  # absent in files written before the bench recorded load
    units: str  # UNITS: the file's durations are as declared here; absent in files before it (read_bench_row)
    scale_bytes: int
    model: str
    hosts: int
    ranks_per_host: int
    network: str
    rate: str | None
    dilate: float | None  # None in files from before --dilate
    compute: str
    date: str
    steps_per_round: int
    rounds: int
    trimmed: Trimmed  # absent where nothing was cut
    batch_size: int
    command: str


class TrainResult(TypedDict, total=False):
    """What ``gradsched train``'s rank 0 writes (``result.json``); the command prints or emits it
    (no dilation: real compute, real seconds)."""

    model: str
    params: int
    nproc: int
    backend: str
    strategy: str
    operations: int | None
    steps: int
    batch_size: int
    optimizer: str
    warmup_steps: int
    iteration_s_median: float
    iteration_s_mean: float
    iteration_s: list[float]  # every step's
    loss_first: float
    loss_last: float
    losses: list[float]  # the ranks' mean, per step
    torch_ddp: bool
    plan_hash: str | None
    density: float | None  # a sparse plan's
    autotune: Autotune
    predicted_iteration_s: float | None
    measured_iteration_s_after_switch: float | None
    peak_extra_bytes: int | None
    saved_params: str | None
    trace: str | None


def _scaled(value: Any, factor: float) -> Any:
    """Every number in ``value`` (a number, or lists and dicts of them) times ``factor``."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value * factor
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    return value


def _convert(value: Any, hint: Any, factor: float) -> Any:
    """``value`` of type ``hint`` with every ``Emulated`` field's numbers times ``factor``."""
    if value is None:
        return None
    if typing.get_origin(hint) is Annotated:
        return _scaled(value, factor) if EMULATED in hint.__metadata__ else _convert(value, hint.__origin__, factor)
    if typing.get_origin(hint) in (Union, types.UnionType):
        typed = [a for a in typing.get_args(hint) if typing.is_typeddict(a)]
        return _convert(value, typed[0], factor) if typed else value
    if typing.is_typeddict(hint) and isinstance(value, dict):
        fields = typing.get_type_hints(hint, include_extras=True)
        return {k: _convert(v, fields[k], factor) if k in fields else v for k, v in value.items()}
    if typing.get_origin(hint) is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [_convert(v, item, factor) for v in value]
    return value


def to_emulated(result: BenchResult, dilate: float) -> BenchResult:
    """``result`` (the workers', in run seconds) with every ``Emulated`` field divided by ``dilate``
    and ``dilate`` stated; as it is when ``dilate`` is 1."""
    if dilate == 1:
        return result
    out: BenchResult = _convert(result, BenchResult, 1.0 / dilate)
    out["dilate"] = dilate
    return out


def contention_to_run(history: list[dict[str, float]], dilate: float) -> list[dict[str, float]]:
    """Earlier jobs' fitted contention figures (emulated seconds, as their JSON holds them) in this
    job's run seconds, to pool with the figures its workers measure."""
    return [_convert(h, Fitted, dilate) for h in history]


def pooled_contention(own: dict[str, float], history: list[dict[str, float]], dilate: float) -> dict[str, float]:
    """Each fitted figure at its median over this job's ``own`` (run seconds, as its workers measured)
    and earlier jobs' ``history`` (emulated seconds, as their JSON holds them): in run seconds."""
    from gradsched.calibration import across_jobs

    return across_jobs(own, contention_to_run(history, dilate))


def undeclared(value: Any, hint: Any = BenchResult, path: str = "") -> list[str]:
    """The paths in ``value`` that ``hint`` does not declare (an ``Any`` or plain ``dict`` declares all
    below it): a field that would be left unconverted without anyone deciding so."""
    if value is None:
        return []
    if typing.get_origin(hint) is Annotated:
        return []
    if typing.get_origin(hint) in (Union, types.UnionType):
        typed = [a for a in typing.get_args(hint) if typing.is_typeddict(a)]
        return undeclared(value, typed[0], path) if typed else []
    if typing.is_typeddict(hint) and isinstance(value, dict):
        fields = typing.get_type_hints(hint, include_extras=True)
        return [p for k, v in value.items()
                for p in ([f"{path}.{k}"] if k not in fields else undeclared(v, fields[k], f"{path}.{k}"))]
    if typing.get_origin(hint) is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [p for i, v in enumerate(value) for p in undeclared(v, item, f"{path}[{i}]")]
    return []


def to_run(row: BenchJsonRow, dilate: float) -> BenchJsonRow:
    """A bench JSON row written with :data:`UNITS` (every ``Emulated`` field divided by ``dilate`` once,
    by :func:`to_emulated`) back in the run's seconds, the unit of its measured profile and cluster."""
    return row if dilate == 1 else _convert(row, BenchJsonRow, dilate)


# Files written before UNITS (22f138f to a8db2c5, 3-6 Dec 2026) were converted by a rule on key
# names (gradsched.commands.bench.undilate, as it was): a float whose key has an ``s`` unit, under
# dicts and under lists whose key has one, except below these keys.  What it left dilated stays so
# in those files: ``runtime_overhead_s``'s and ``trial_decision.rounds``' numbers (keyed by a
# runtime or plan hash), ``op_host_samples``, ``trial_decision.measured``; what it divided though
# it was no duration (a planner option named ``*_s``) is divided there too.
_LEGACY_KEPT = frozenset({"job_s", "resample_s", "measured", "cluster", "peak_rss_bytes", "phases"})
_LEGACY_SECONDS = re.compile(r"(?:^|_)s(?:_|$)")


def _legacy_scaled(value: Any, key: str, factor: float) -> Any:
    """``value`` (under ``key``) with what the old rule divided times ``factor``: its exact inverse."""
    if key in _LEGACY_KEPT:
        return value
    if isinstance(value, dict):
        return {k: _legacy_scaled(v, k, factor) for k, v in value.items()}
    if isinstance(value, list):
        inner = key if _LEGACY_SECONDS.search(key) else ""
        return [_legacy_scaled(v, inner, factor) for v in value]
    if isinstance(value, float) and _LEGACY_SECONDS.search(key):
        return value * factor
    return value


def read_bench_row(row: dict[str, Any]) -> tuple[BenchJsonRow, float]:
    """A ``gradsched bench --json`` row in the run's seconds, whichever rule wrote it, and its dilation.

    With ``units`` (:data:`UNITS`): by the declared types (:func:`to_run`).  Without: the old rule
    on key names undone (``_legacy_scaled``), so that each figure is in the run's seconds as the
    measured profile and cluster are; files without ``dilate`` (before it) or at 1 are as they were
    run.  A file converted by the types but written before rows carried ``units`` reads by the old
    rule: add ``"units": "gradsched.jobs.results/1"`` to its rows to read it right (the dates are in
    docs/notes/2026-12-bench-runs.md)."""
    dilate = float(row.get("dilate") or 1.0)
    if dilate == 1:
        return row, dilate  # type: ignore[return-value]
    if row.get("units") == UNITS:
        return to_run(row, dilate), dilate  # type: ignore[arg-type]
    if "units" in row:
        raise GradschedError(f"bench JSON units {row['units']!r}: this gradsched reads {UNITS!r}")
    return _legacy_scaled(row, "", dilate), dilate
