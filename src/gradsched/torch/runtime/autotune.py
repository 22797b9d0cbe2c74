"""``strategy="auto"`` in the runtime: measure in situ, plan, switch; re-plan when timings drift.

    model = gradsched.torch.DistributedDataParallel(module, "auto")     # options: plan_options={...}

0. **Deferred start** (``defer``, where the trials are budgeted with PyTorch's DDP among them: the
   default): the job starts on the baseline, PyTorch's DDP at the user's bucket size, untraced; at
   ``switch_iteration`` rank 0 broadcasts the iteration at which profiling starts, once its expected
   cost fits ``trial_share`` of the time trained (:mod:`gradsched.tuning.schedule`); steps 1-2 then
   start there (the start-up probes too), and what they cost counts against the trials' budget.
1. **Profile in situ.**  Iterations ``0 .. switch_iteration - 1`` run a safe default
   (``initial``, default ``wfbp``) on gradsched's executor, traced: every gradient's
   ready time, every operation from issue to completion, forward, waits and updates
   (:mod:`gradsched.torch.runtime.trace`).  Iteration 0 is a warm-up and is left out.
2. **Plan.**  At the start of iteration ``switch_iteration`` (fixed in advance, so the
   ranks need no extra agreement) every rank finishes outstanding work, rank 0 turns
   the medians of what it measured into a :class:`~gradsched.profile.Profile` and a
   fitted :class:`~gradsched.cluster.Cluster`, plans ``auto`` (the simulator's search
   over all dense strategies) and broadcasts the plan, its issue order and the
   prediction; every rank then swaps its executor.  Gradients of the finished
   iteration are already applied, so the numbers computed are unchanged: only the
   buckets and the order of the collectives differ.
3. **Trials.**  The simulator can be wrong on a given machine, so the first plan is
   not trusted blindly: it, its strategy with default options, the best plans of the
   next ``trials - 1`` strategies by prediction, the best plan for a ``profile=`` and
   ``cluster=`` given to the wrapper (if any), PyTorch's DDP at up to three bucket sizes
   (:mod:`gradsched.torch.runtime.torch_ddp`; DDP's buckets on the executor without it)
   and the initial plan take turns, ``trial_rounds`` times over, in windows of
   :attr:`AutoTuneConfig.trial_window` iterations (``trial_iterations`` each in all;
   more where iterations are short, so that a window lasts ``trial_window_s``: rank 0
   sets the length at the first plan), at iterations known in advance.  The plans within
   ``runoff_margin`` of the fastest median, if more than one, and the baseline then take
   ``runoff_rounds`` more turns (the run-off: rank 0 names them).  Then rank 0
   broadcasts the plan whose windows measured fastest (PyTorch's DDP at the user's bucket
   size stays unless beaten by ``min_gain`` overall and in most rounds, or by PyTorch's DDP
   at another bucket size by ``resize_min_gain`` and in most rounds) and the
   strategies that lost are excluded.  Taking turns spreads each plan's iterations over
   the machine's slow and fast phases; one window per plan let a lucky window pick the
   winner.  By default (``trial_share`` > 0) the trials cost at most that share of the time
   trained so far (:mod:`gradsched.calibration.budget`): the baseline runs first and, as a
   rest, between candidate windows until the next one fits; a candidate that can no longer
   win is dropped; candidates predicted clearly slower are not tried; rank 0 broadcasts each
   next window.  ``trials=off``: no trials (nor re-plans, unless ``max_replans`` is given).
4. **Re-plan.**  Every ``patience`` iterations after the trials (again at iterations
   known in advance) rank 0 compares the median of the last ``patience`` measured
   iterations with what the plan is expected to take (what the trials' winner measured
   in them; after a re-plan, its prediction corrected by the simulator's error on the
   plan just measured) and broadcasts its decision: off by more than
   ``replan_threshold`` means the current plan runs ``patience`` more iterations traced
   in full, and those measurements (its own ready and collective times, under its own
   load) are turned into a new profile and cluster and ``auto`` is planned again.  At
   most ``max_replans`` times; after that no more checks (and no more broadcasts) are
   made, but for one check of the last re-plan's plan.  A re-plan's plan runs in no
   trial, so at its checks it must measure faster than every plan measured so far by
   ``min_gain`` (the trials' rule against PyTorch's DDP), or ``auto`` reverts to the
   fastest of them.  Before a check re-plans a plan the trials measured, the fastest other
   plan they measured on gradsched's executor (the *control*) runs ``patience`` iterations: if it
   is off what it measured by the same factor, within ``replan_threshold``, the drift is the
   machine's (every plan slowed alike: nothing to gain by re-planning), the plan stays and is
   expected to run at the check's pace from then on; otherwise the re-plan goes ahead.
   ``gradsched bench`` holds the checks once its warm-up ends (:meth:`AutoTuner.hold_checks`),
   so that its counted rounds time one plan.

Only the profiling window and a re-plan's measuring window stamp every operation's
completion (:attr:`~gradsched.torch.runtime.trace.Tracer.completions`): the stamp is a Python
callback per operation that slows the plan under measurement, and trials and checks
need only iteration times, so the plans compared there run as they would untraced.

Operation costs: each traced operation's *service time* is its completion minus the
later of its issue and the previous operation's completion (operations of one rank
complete in order on one channel, which is what the simulator assumes), so queueing
behind earlier operations is not counted twice.  Per size the median over
iterations is kept; an alpha-beta line is fitted through them
(:meth:`CollectiveCost.fit`).  When the initial plan has too few distinct operation
sizes for a line, a few probe all-reduces of known sizes at start-up supply the rest.

Options (``plan_options`` of ``"auto"``; ``gradsched train --opt KEY=VALUE``):
``switch_iteration`` (5), ``initial`` ("wfbp"), ``initial_options`` ({}), ``trials``
(3; 0 or off: none), ``trial_iterations`` (12), ``trial_rounds`` (3), ``trial_window_s`` (0.3),
``trial_share`` (0.01), ``defer`` (true), ``min_gain``
(0.03), ``resize_min_gain`` (0.01), ``runoff_rounds`` (4), ``runoff_margin`` (0.05),
``replan_threshold`` (0.15), ``patience`` (10), ``max_replans`` (3), ``adaptive`` (true;
false plans ``auto`` once at start-up from ``profile=``/``cluster=``, as any other
strategy), and the ``auto`` planner's own ``channels`` and ``exclude``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from gradsched.calibration import (IssueTimes, StepRecord, TrialBudget, decide, fastest, fit_cluster, issue_times,
                                   measured_profile, out_of_the_running, runoff_plans, service_points)
from gradsched.calibration.budget import SWITCH_BACK_ITERATIONS
from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.timeline import Event
from gradsched.torch.runtime.groups import backend_of
from gradsched.torch.runtime.startup import broadcast_object, gather_object, wait
from gradsched.torch.runtime.torch_ddp import candidate_plan, one_bucket_mb
from gradsched.tuning.candidates import TORCH_DDP, is_torch_ddp
from gradsched.tuning.candidates import label as _label
# the configuration, its rules and records live in the torch-free core (gradsched.tuning); their names stay here
from gradsched.tuning.config import (KEEP_POINTS, MAX_TRIAL_WINDOW, MIN_SIZES, OFFLINE_TRIALS, PLANNER_KEYS,
                                     PREDICTED_FAR_SLOWER, PREDICTED_SLOWER, PROBE_BYTES, RUNOFF_PLANS, SAMPLES_KEPT,
                                     TRIALS, AutoTuneConfig, not_clearly_slower, trials_option)
from gradsched.tuning.records import Check, PlanMeasurements, Switch
from gradsched.tuning.rules import (baseline_of, capped, control_of, next_check, next_window, replan_at, resized_of,
                                    runnable, shared_drift, trial_candidates)

if TYPE_CHECKING:
    from gradsched.planners.auto import Ranked
    from gradsched.torch.runtime.trace import Tracer

logger = logging.getLogger("gradsched.autotune")

__all__ = ["KEEP_POINTS", "MAX_TRIAL_WINDOW", "MIN_SIZES", "OFFLINE_TRIALS", "PLANNER_KEYS", "PREDICTED_FAR_SLOWER",
           "PREDICTED_SLOWER", "PROBE_BYTES", "RUNOFF_PLANS", "SAMPLES_KEPT", "TRIALS", "AutoTuneConfig",
           "AutoTuner", "Check", "Switch", "TunedModel", "not_clearly_slower", "planned_on", "trial_options",
           "trials_option"]

# what a plan's options carry beside the planner's own: offline auto's record of its choice (its ``chosen_options``
# are the planner's), and the prediction
_NOT_PLANNER_OPTIONS = frozenset({"chose", "chosen_options", "candidates", "predicted_iteration_s"})


def trial_options(plan: Plan) -> dict[str, Any]:
    """The planner options that made a trial's ``plan`` (offline ``auto``'s choice: the chosen planner's), as the
    trial record keeps them beside its label: two candidates of one strategy (``usbyte`` with ``groups=0``, whole
    groups in forward-order priority, and ``usbyte`` in 256 KiB units) share a label and differ only here."""
    opts = plan.options
    if isinstance(opts.get("chosen_options"), dict):
        return dict(opts["chosen_options"])
    return {k: v for k, v in opts.items() if k not in _NOT_PLANNER_OPTIONS}


# what a trial's plan was planned on (the trial record's ``planned_on``)
MEASURED = "measured"  # the profile of the iterations measured in training (the plan chosen, runners-up, defaults)
GIVEN = "given"  # the profile and cluster passed to the wrapper (as ``gradsched bench`` passes its own)
START_UP = "start-up"  # the plan made at start-up that profiling ran (deferred: after PyTorch's DDP)


def planned_on(planned: str, trials: list[tuple[str, bool]]) -> dict[str, str]:
    """Per plan hash, what the trial candidates were planned on: the plan chosen (hash ``planned``) and the
    ``trials`` (hash, whether it is one of the given profile's best plans) in the order they join the turns; a plan
    reached twice keeps its first origin, as the trials measure it once under its first name.  Two candidates of one
    strategy and options differ here: the README job's two ``usbyte`` ``groups=0`` plans (464.5 and 464.0 ms,
    ``benchmarks/results/bench_main_job_googlenet_k80_2h.json``) were the one chosen from the measured profile and
    offline ``auto``'s from the bench's: the same options, other operations (each ``groups=0`` search ran on its own
    profile)."""
    out = {planned: MEASURED}
    for h, from_given in trials:
        out.setdefault(h, GIVEN if from_given else MEASURED)
    return out


# --------------------------------------------------------------------------- the tuner
@dataclass(frozen=True, kw_only=True)
class TunedModel:
    """The model as the tuner sees it, handed in by the wrapper: fixed facts and a few calls.

    The tuner reads the running plan, asks every rank to finish its outstanding work and
    switches plans at an iteration boundary; it touches nothing else of the wrapper."""

    group: Any  # the process group the plans run on
    world: int
    rank: int
    device: torch.device  # where the start-up probes' buffers live
    profile: Profile  # the model's own profile (tensor sizes in profile order, no timings)
    plan: Callable[[], Plan]  # the plan running now ...
    order: Callable[[], list[int]]  # ... and its issue order
    switch_plan: Callable[[Plan, list[int]], None]  # run this plan from the next backward on (every rank)
    synchronize: Callable[[], None]  # finish outstanding communication and updates
    has_optimizer: Callable[[], bool]  # a DistributedOptimizer is attached (plans may overlap the update)
    timeout_s: float  # the wrapper's: every collective of the tuner's (probes, gathers, broadcasts) is bounded by it
    ddp_bucket_cap_mb: float = 25.0  # what the user set for DDP (its default otherwise): a torch-ddp candidate's size
    ddp_cap_given: bool = False  # whether the user set it (else that candidate is DDP built without bucket_cap_mb)
    release_spares: Callable[[], None] = lambda: None  # drop the PyTorch DDPs kept for trials but not running


class AutoTuner:
    """Run-time state of ``"auto"`` on one rank: what ran, what was predicted, what was measured.

    ``switches`` and ``predicted_iteration_s`` are the same on every rank (rank 0's
    decisions are broadcast); ``checks`` hold rank 0's measurements (empty elsewhere)."""

    def __init__(self, model: TunedModel, config: AutoTuneConfig, tracer: "Tracer",
                 keep_events: bool, offline: tuple[Profile, Cluster] | None = None) -> None:
        self.config = config
        self._offline = offline  # a profile and cluster the user measured: their best plans join the trials
        self.iteration = 0  # training iterations started (forwards that synchronise gradients)
        self.predicted_iteration_s: float | None = None
        self.switches: list[Switch] = [Switch(0, config.initial, model.plan().hash, None, None, "initial")]
        self.checks: list[Check] = []
        self.replans = 0
        # Every plan tried so far (all ranks hold them: decisions are broadcast) and, on
        # rank 0, its measured median: a plan that measured slower than one already tried
        # is reverted and its strategy excluded from later planning (measure, don't trust).
        self._tried: dict[str, tuple[str, Plan, list[int], float | None]] = {
            model.plan().hash: (config.initial, model.plan(), list(model.order()), None)}
        self.measurements = PlanMeasurements()  # rank 0: what each plan measured (gradsched.tuning.records)
        self.rejected: list[str] = []
        # rank 0, once the trials end: what they measured per plan hash, the baseline and the plan kept
        self.trial_decision: dict[str, Any] | None = None
        self._planned_on: dict[str, str] = {}  # rank 0: what each trial candidate was planned on (planned_on)
        self.profile: Profile | None = None  # what the current plan was planned with
        self.cluster: Cluster | None = None
        self._model = model
        self._tracer = tracer
        self._keep_events = keep_events  # the user asked for the trace: never trim it
        self._steps: deque[StepRecord] = deque(  # a trial window's iterations fit, up to MAX_TRIAL_WINDOW
            maxlen=max(config.switch_iteration, config.patience, config.trial_iterations, MAX_TRIAL_WINDOW) + 2)
        self._recent_s: deque[float] = deque(maxlen=1000)  # measured iteration times under the current plan
        self._points: dict[int, deque[float]] = {}
        self._start_checks()
        self._trial_turns: list[str] = []  # plan hashes of the trial windows still to run, in order
        self._trial_candidates: list[str] = []  # the plans that take turns in the trials
        self._runoff: list[str] | None = None  # the plans of the run-off, once the rounds have ended
        self.trial_window = config.trial_window  # iterations a trial window measures (rank 0's, at the first plan)
        self._next_trial: int | None = None
        # budgeted trials (AutoTuneConfig.trial_share); rank 0 decides, every rank follows its broadcast
        self.settled_at: int | None = None  # iteration at which the plan was chosen (trials decided, or none)
        self._start_s: float | None = None  # rank 0: when the first iteration started
        self._budget: TrialBudget | None = None  # rank 0: what the trials cost so far
        self._window_start: tuple[float, int] | None = None  # rank 0: time and iteration the current window started
        self._window_len = config.trial_window  # measured iterations of the window running
        self._resting = False  # the window running is a rest: the baseline, outside the rounds
        self._last_base_s: float | None = None  # rank 0: the baseline's latest window median
        self._dropped: list[str] = []  # rank 0: candidates out of the running (lost a round they had to win)
        self._switch_back: tuple[int, float] | None = None  # rank 0: iteration and time of a switch back, to price
        self._root = dist.get_global_rank(model.group, 0)
        self._initial = model.plan().hash  # the plan profiling runs (the executor's, traced)
        self._start_schedule()

    def _start_checks(self) -> None:
        """Every rank, at start-up: no drift check, re-plan or control window scheduled, none held."""
        self._next_check: int | None = None
        self._next_replan: int | None = None  # where a re-plan's measuring window ends
        self._next_control: int | None = None  # where a control plan's window ends (a drifting check's: _control)
        # every rank: the plan a control window left, its prediction; rank 0 also: the check's median and expectation
        # (its drift: the ratio of the two)
        self._control_from: tuple[str, float | None, float, float] | None = None
        self.held_from: int | None = None  # iteration from which no drift check is made (hold_checks)
        self._checking_replan = False  # the check scheduled is a re-plan's plan's (it may revert it)
        # rank 0: the machine's pace against the trials' (a shared drift's factor: _control_done); a control plan is
        # expected to run at what it measured in the trials times this, as the current plan at _expected_s
        self._pace = 1.0
        # What a check compares its measurement with (rank 0): after the trials, what the winner
        # measured in them; after a plan, its prediction times the simulator's error on the plan
        # just measured (both from the same measurements).  The simulator's own error on this
        # machine is then not mistaken for drift: on 2 hosts sharing 2 cores (vgg, 1600mbit),
        # every check was 15-25% above the raw prediction, and each re-plan left the trials'
        # winner for a plan no one had measured.
        self._expected_s: float | None = None

    def _start_schedule(self) -> None:
        """Every rank, at start-up: profiling from iteration 0, or, deferred, PyTorch's DDP until it pays."""
        self._profiled_at: int | None = None  # iteration at which the first plan was made (profiling ended)
        self._profile_from: int | None = 0  # iteration at which profiling starts or started
        self._profile_start_s: float | None = None  # ... and when (rank 0; None: from the first iteration)
        self._profile_end: int | None = self.config.switch_iteration  # iteration at which profiling ends (the plan)
        self._waiting: int | None = None  # deferred: iteration at which rank 0 names when profiling starts
        self._probes: list[tuple[int, float]] = []
        self._rest_s: float | None = None  # rank 0, deferred: the baseline's median before profiling
        if self.config.deferred:
            self._profile_from = None
            self._start_on_baseline()
        else:
            self._probes = self._probe() if self._needs_probes() else []

    def _needs_probes(self) -> bool:
        """The initial plan has too few distinct operation sizes for a line fit: probes supply more."""
        initial = self._tried[self._initial][1]
        return len(set(initial.op_bytes(self._model.profile))) < MIN_SIZES

    def _start_on_baseline(self) -> None:
        """Every rank, deferred (:attr:`AutoTuneConfig.deferred`): run PyTorch's DDP at the user's bucket size
        from iteration 0, untraced; rank 0 names when profiling starts once the baseline's time is known."""
        from gradsched.torch.runtime.planning import default_cluster, issue_order

        model = self._model
        cluster = default_cluster(model.world)
        base = candidate_plan(model.profile, cluster, model.ddp_bucket_cap_mb, default=not model.ddp_cap_given)
        order = issue_order(base, model.profile, cluster)
        self._tried[base.hash] = (TORCH_DDP, base, list(order), None)
        model.switch_plan(base, order)
        self.switches = [Switch(0, TORCH_DDP, base.hash, None, None, "initial")]
        self._tracer.completions = self._keep_events  # nothing of gradsched's runs until profiling
        self._profile_end = None
        self._waiting = self.config.switch_iteration

    @property
    def before_profiling(self) -> bool:
        """Deferred, still on the baseline (PyTorch's DDP): profiling neither started nor done."""
        return self.config.deferred and self._profiled_at is None and self._profile_end is None

    # ------------------------------------------------------------------ hook
    def on_iteration_start(self) -> None:
        """Called by the wrapper at the start of every gradient-synchronising forward: an
        iteration boundary (the previous step's update is done or due)."""
        now = self._tracer.now()
        if self._start_s is None:
            self._start_s = now
        if self._steps and self._steps[-1].end_s is None:
            prev = self._steps[-1]
            prev.end_s = now
            if prev.measured and prev.step > 0:
                self._recent_s.append(prev.duration_s)
        step = self.iteration
        self.iteration += 1
        if self._switch_back is not None and step >= self._switch_back[0] + SWITCH_BACK_ITERATIONS:
            self._count_switch_back()
        acted = True
        if step == self._waiting:
            self._schedule_profiling(step)
        elif step == self._profile_from and self._profile_end is None and self._profiled_at is None:
            self._start_profiling(step)
        elif step == self._profile_end:
            self._profile_end = None
            window = [s for s in self._steps if s.measured and s.step > (self._profile_from or 0)]
            self._retune(step, window, "profiled")
        elif step == self._next_trial:
            self._trial(step)
        elif step == self._next_check:
            self._check(step)
        elif step == self._next_replan:
            self._next_replan = None
            self._retune(step, self._window(self.config.patience), "replan")
        elif step == self._next_control:
            self._control_done(step)
        else:
            acted = False
        self._steps.append(StepRecord(step, self._tracer.iteration, now, measured=not acted))
        if acted or step % self.config.patience == 0:
            self._trim()

    # ------------------------------------------------------------------ decisions
    def _schedule_profiling(self, step: int) -> None:
        """Every rank, deferred: rank 0 names the iteration at which profiling starts, once its expected cost
        fits the trials' share of the time trained (:func:`gradsched.tuning.schedule.profiling_rest`); it
        starts now if it fits already.  One broadcast: the baseline runs untouched until then."""
        from gradsched.tuning.schedule import profiling_cost_s, profiling_rest

        self._waiting = None
        start = None
        if self._is_root:
            window = [s for s in self._steps if s.measured and s.step > 0]
            base_s = statistics.median(s.duration_s for s in window) if window else 0.0
            iterations = self.config.switch_iteration
            cost = profiling_cost_s(base_s, iterations)
            start = step + profiling_rest(self._tracer.now() - self._start_s, base_s, self.config.trial_share,
                                          cost, iterations)
            logger.info("auto: on PyTorch's DDP (%.2f ms per iteration); profiling from iteration %d, when its "
                        "expected cost (%.0f ms) fits %g of the time trained", base_s * 1e3, start, cost * 1e3,
                        self.config.trial_share)
        start = self._broadcast(start)
        if start <= step:
            self._start_profiling(step)
        else:
            self._profile_from = start

    def _start_profiling(self, step: int) -> None:
        """Every rank: leave the baseline for the initial plan on the executor, every operation stamped, for
        ``switch_iteration`` iterations (the first is left out, as iteration 0 is without ``defer``)."""
        self._model.synchronize()
        if self._is_root:
            self._profile_start_s = self._tracer.now()
            rest = self._window(MAX_TRIAL_WINDOW)  # the baseline's last iterations (deferred: the rest)
            if rest:
                self._rest_s = statistics.median(s.duration_s for s in rest)
        if self._needs_probes():
            self._probes = self._probe()
        strategy, plan, order, _ = self._tried[self._initial]
        self._switch(step, strategy, plan, order, None, self.measured_iteration_s, "profiling")
        self._tracer.completions = True
        self._profile_from = step
        self._profile_end = step + self.config.switch_iteration

    def _check(self, step: int) -> None:
        self._model.synchronize()  # every rank quiescent: the broadcast below cannot interleave with a plan's op
        window = self._window(self.config.patience)
        decision = None
        if self._is_root:
            measured = statistics.median(s.duration_s for s in window)
            predicted = self.predicted_iteration_s or measured
            expected = self._expected_s or predicted
            current = self._model.plan().hash
            self._record(current, window)
            # a re-plan's plan ran in no trial: it stays only while it beats every plan measured, by min_gain
            untried = self.config.min_gain if self.switches[-1].reason == "replan" else None
            decision = decide(current, measured, expected, self.measurements.compared(), self.config.replan_threshold,
                              untried)
            decision = capped(decision, self.replans, self.config.max_replans)
            # (controls: plans the trials measured taking turns, untraced; none without trials)
            control = control_of(self.measurements.settled, current, {h: t[:2] for h, t in self._tried.items()})
            if decision[0] == "replan" and untried is None and control is not None:
                decision = ("control", control)  # first see whether the control plan drifted alike
                self._control_from = (current, self.predicted_iteration_s, measured, expected)
            self.checks.append(Check(step, measured, predicted, decision[0] in ("replan", "revert"), expected,
                                     decision[0]))
            logger.debug("auto: iteration %d: measured %.2f ms, expected %.2f ms (predicted %.2f ms): %s", step,
                         measured * 1e3, expected * 1e3, predicted * 1e3, decision[0])
        action, target = self._broadcast(decision)
        if action == "keep":
            self._schedule_check(step)
            return
        if action == "control":
            self._control(step, target, window)
            return
        self.replans += 1
        if action == "revert":
            self._revert(step, target, window)
            self._schedule_check(step)
        else:
            # measure the current plan for a new one: `patience` iterations with every completion stamped
            self._tracer.completions = True
            self._next_check = None
            self._next_replan = replan_at(step, self.config)

    def _control(self, step: int, target: str, window: list[StepRecord]) -> None:
        """Every rank, at a check off what was expected: run the control plan ``target`` (the fastest other plan
        the trials measured, :func:`~gradsched.tuning.rules.control_of`) for ``patience`` iterations, then decide
        (:meth:`_control_done`).  A drift every plan shares (the machine slowed: other work on its cores, a
        slower network for all) is no reason to re-plan; a plan measured beside it, at the same time, tells
        the two apart where the check alone cannot."""
        current = self._model.plan().hash
        if not self._is_root:  # rank 0 set it at the check, with its measurement
            self._control_from = (current, self.predicted_iteration_s, 0.0, 0.0)
        strategy, plan, order, predicted = self._tried[target]
        measured_before = statistics.median(s.duration_s for s in window) if window else None
        self._switch(step, strategy, plan, order, predicted, measured_before, "control")
        self._next_check = None
        self._next_control = step + self.config.patience + 1

    def _control_done(self, step: int) -> None:
        """Every rank, at the end of a control window: back to the plan it left; rank 0 decides whether the check's
        drift was shared (:func:`~gradsched.tuning.rules.shared_drift`): then the plan stays and is expected to
        run as the check measured it from now on (the machine's new pace); otherwise the plan is re-planned, as a
        check does (its ``patience`` iterations measured in full first)."""
        self._model.synchronize()
        self._next_control = None
        assert self._control_from is not None
        back, back_predicted, check_s, expected_s = self._control_from
        self._control_from = None
        window = self._window(self.config.patience)
        measured_before = statistics.median(s.duration_s for s in window) if window else None
        shared = None
        if self._is_root:
            control = self._model.plan().hash
            control_expected = self.measurements.settled.get(control, 0.0) * self._pace
            if window:
                self._record(control, window)
            shared = measured_before is not None and shared_drift(check_s, expected_s, measured_before,
                                                                  control_expected, self.config.replan_threshold)
            logger.info("auto: iteration %d: the check measured %.2f ms against %.2f expected, the control plan %s "
                        "ms against %.2f: %s", step, check_s * 1e3, expected_s * 1e3,
                        "-" if measured_before is None else f"{measured_before * 1e3:.2f}", control_expected * 1e3,
                        "the machine's drift, the plan stays" if shared else "the plan's own drift, re-plan")
        shared = self._broadcast(shared)
        strategy, plan, order, _ = self._tried[back]
        self._switch(step, strategy, plan, order, back_predicted, measured_before, "back")
        if shared:
            if self._is_root:  # the plan's pace on the machine as it is now, and the machine's for the next control
                self._pace *= check_s / expected_s
                self._expected_s = check_s
            self._schedule_check(step)
            return
        self.replans += 1  # (below the cap: the check capped its decision)
        self._tracer.completions = True
        self._next_check = None
        self._next_replan = replan_at(step, self.config)

    def hold_checks(self, step: int | None = None) -> None:
        """Every rank alike: no drift check from now on (``gradsched bench``'s counted rounds, which time the plan
        ``auto`` settled on, one plan in a row).  What is under way ends as it would: a control window, a
        re-plan's measuring window and the check of a re-plan's plan (which may revert it); :attr:`done` says
        when nothing is left.  ``held_from``: the iteration of the latest call (``step``, else the next to start)."""
        self.held_from = self.iteration if step is None else step
        if self._next_control is None and self._next_replan is None and not self._checking_replan:
            self._next_check = None

    def _revert(self, step: int, target: str, window: list[StepRecord]) -> None:
        """Every rank: go back to plan ``target`` (measured faster) and exclude the current strategy."""
        strategy, plan, order, predicted = self._tried[target]
        self.rejected.append(self.switches[-1].strategy)
        measured_before = statistics.median(s.duration_s for s in window) if window else None
        # what it measured when it ran is the best prediction there is
        predicted = self._broadcast(self.measurements.compared().get(target, predicted) if self._is_root else predicted)
        self._switch(step, strategy, plan, order, predicted, measured_before, "revert")
        self._expected_s = predicted
        self._pace = 1.0  # (rank 0) expected as it measured in the trials, as every control plan
        logger.info("auto: iteration %d: %s measured slower than %s did; back to %s, %s excluded from now on", step,
                    self.rejected[-1], strategy, strategy, self.rejected[-1])

    def _trial(self, step: int) -> None:
        """Every rank: the current trial plan has run its iterations; switch to the next one, or,
        when all have run, to the one that measured fastest (rank 0's measurement, broadcast)."""
        self._model.synchronize()
        if self.config.budgeted:
            self._budgeted_trial(step)
            return
        window = self._window(self.trial_window)
        measured_before = statistics.median(s.duration_s for s in window) if window else None
        if self._is_root and measured_before is not None:
            self._record(self._model.plan().hash, window)
            self.measurements.add_round(self._model.plan().hash, measured_before)
        if not self._trial_turns and self._runoff is None:  # the rounds are over: a run-off if they were close
            self._runoff = self._broadcast(self._runoff_plans()) if self.config.runoff_rounds else []
            self._trial_turns = self._runoff * self.config.runoff_rounds
        if self._trial_turns:
            strategy, plan, order, predicted = self._tried[self._trial_turns.pop(0)]
            self._switch(step, strategy, plan, order, predicted, measured_before, "trial")
            self._next_trial = step + self.trial_window + 1
            return
        self._next_trial = None
        best = None
        if self._is_root:
            baseline = self._baseline()
            taken = self._taken()
            rounds = self.measurements.rounds_of(taken)
            resized = self._resized(baseline, taken)
            best = fastest(taken, baseline, self.config.min_gain, rounds, resized, self.config.resize_min_gain)
            self.trial_decision = {"measured": dict(taken), "rounds": rounds, "baseline": baseline, "kept": best,
                                   "resized": sorted(resized), **self._plans_record(taken),
                                   "runoff": list(self._runoff or [])}
        self._keep(step, self._broadcast(best), measured_before)

    def _keep(self, step: int, best: str, measured_before: float | None) -> None:
        """Every rank, when the trials are decided: run ``best`` from now on; the other strategies are out."""
        strategy, plan, order, predicted = self._tried[best]  # every candidate has a prediction
        # measured slower than the winner: the simulator's ranking does not hold here, keep them out
        self.rejected.extend(sorted({s for s, *_ in self._tried.values() if s != strategy} - set(self.rejected)))
        if best != self._model.plan().hash:
            self._switch(step, strategy, plan, order, predicted, measured_before, "fastest")
        self._model.release_spares()  # the PyTorch DDPs kept for the trials' windows, but the one running
        if self._is_root:  # checks look for drift from what the winner measured, not from the simulator
            self._expected_s = self.measurements.measured[best]
            self.measurements.settle()  # checks compare plans by what they measured taking turns
        logger.info("auto: iteration %d: of the plans tried, %s measured fastest; it stays", step, strategy)
        self._settled(step, "after trials")
        self._schedule_check(step)

    def _settled(self, step: int, how: str) -> None:
        """Every rank: the plan is chosen (later checks may still re-plan, up to ``max_replans``); say so."""
        self.settled_at = step
        cost = ""
        if self._is_root and self._budget is not None and self.measurements.measured.get(self._baseline() or ""):
            base = self._budget_base_s(self._baseline())
            cost = (f"; {len(self._budget.windows)} trial windows of other plans, {len(self._dropped)} plans "
                    f"dropped early, cost {self._budget.spent_s(base) * 1e3:.0f} ms beyond the baseline in "
                    f"{self._tracer.now() - self._budget.start_s:.1f} s")
        if self._is_root:
            logger.info("auto: settled on %s at iteration %d, %s%s", self.switches[-1].strategy, step, how, cost)

    def _budgeted_trial(self, step: int) -> None:
        """Every rank, trials within :attr:`AutoTuneConfig.trial_share`: rank 0 measures the window that ended and
        decides what runs next (:meth:`_next_window`): a candidate's window, a rest on the baseline, or the end."""
        window = self._window(self._window_len)
        measured_before = statistics.median(s.duration_s for s in window) if window else None
        decision = self._broadcast(self._next_window(step, window) if self._is_root else None)
        self._trial_turns = list(decision["turns"])
        if decision.get("runoff") is not None:
            self._runoff = list(decision["runoff"])
        if decision["kind"] == "end":
            self._next_trial = None
            self._keep(step, decision["plan"], measured_before)
            return
        strategy, plan, order, predicted = self._tried[decision["plan"]]
        if plan.hash != self._model.plan().hash:
            self._switch(step, strategy, plan, order, predicted, measured_before, "trial")
            if self._is_root and plan.hash == self._baseline():
                self._switch_back = (step, self._tracer.now())  # its first iterations count against the budget
        self._resting = decision["kind"] == "rest"
        self._window_len = decision["iterations"]
        self._next_trial = step + decision["iterations"] + 1
        if self._is_root:
            self._window_start = (self._tracer.now(), step)

    def _next_window(self, step: int, window: list[StepRecord]) -> dict[str, Any]:
        """Rank 0, budgeted trials: record the window that ended (a candidate's is compared with the baseline's
        window just before it), drop the candidates that can no longer be kept, and say what runs next."""
        current, base = self._model.plan().hash, self._baseline()
        now = self._tracer.now()
        if window:
            self._record(current, window)
            median = statistics.median(s.duration_s for s in window)
            if current == base:
                self._last_base_s = median
            if not self._resting:  # a candidate's window against the baseline's before it
                self.measurements.add_round(current, median, None if current == base else self._last_base_s or median)
        if current != base and self._window_start is not None:
            self._budget.windows.append((now - self._window_start[0], step - self._window_start[1]))
        rounds = self.config.trial_rounds + (self.config.runoff_rounds if self._runoff else 0)
        resized = self._resized(base, self._taken())
        for h in self._alive(base) if base is not None else []:  # (no baseline: nothing to lose a round to)
            margin = 0.0 if h in resized else self.config.min_gain  # fastest's rule: a clear win, or a resize's
            if out_of_the_running(self.measurements.wins(h, margin), rounds):
                self._dropped.append(h)
        taken = {h: t for h, t in self._taken().items() if h not in self._dropped}
        decision = next_window([h for h in self._trial_turns if h not in self._dropped], base, taken,
                               self._runoff is not None, self.config, self.trial_window,
                               lambda: self._budget.rest_before(now, self._budget_base_s(base), self.trial_window + 1))
        if decision["kind"] == "end":
            decision["plan"] = self._decide(base)
        return decision

    def _count_switch_back(self) -> None:
        """Rank 0: the baseline's first iterations after another plan count against the trials' budget
        (:meth:`~gradsched.calibration.TrialBudget.count_switch`): a switch back costs too."""
        switched, self._switch_back = self._switch_back, None
        if self._budget is None or switched is None:
            return
        start, since_s = switched  # from the switch on (what came before it in that iteration is counted already)
        last = [s.end_s for s in self._steps if s.step == start + SWITCH_BACK_ITERATIONS - 1 and s.end_s is not None]
        base_s = self._budget_base_s(self._baseline())
        if last and base_s > 0:
            self._budget.count_switch(last[0] - since_s, SWITCH_BACK_ITERATIONS, base_s)

    def _budget_base_s(self, base: str | None) -> float:
        """Rank 0: the baseline's iteration time the trials' cost is counted against: its median in the trials'
        windows, or, deferred, the median of its last iterations before profiling if that is less.  A window
        of the baseline measured in a slow phase made the candidates' windows look free (cnn over loopback at
        load 15: its first window 0.167 s against 0.093 s over the job, and 15 candidate windows ran back to
        back); counting against the lower figure errs towards resting."""
        measured = self.measurements.measured.get(base or "", 0.0)
        if self._rest_s is not None and (not measured or self._rest_s < measured):
            return self._rest_s
        return measured

    def _alive(self, base: str | None) -> list[str]:
        """Rank 0: the trial candidates still in the running (the baseline aside)."""
        return [h for h in self._trial_candidates if h != base and h not in self._dropped]

    def _decide(self, base: str | None) -> str:
        """Rank 0, at the end of budgeted trials: the plan kept (:func:`~gradsched.calibration.fastest` over the
        candidates still in the running, each window against the baseline's before it)."""
        taken = {h: t for h, t in self._taken().items() if h == base or h not in self._dropped}
        rounds = self.measurements.rounds_of(taken)
        resized = self._resized(base, taken)
        best = fastest(taken, base, self.config.min_gain, rounds, resized, self.config.resize_min_gain,
                       self.measurements.paired)
        self.trial_decision = {"measured": dict(taken), "rounds": rounds, "baseline": base, "kept": best,
                               "resized": sorted(resized), **self._plans_record(taken),
                               "runoff": list(self._runoff or []), "paired": dict(self.measurements.paired),
                               "dropped": list(self._dropped),
                               "cost_s": self._budget.spent_s(self._budget_base_s(base)),
                               "switches_s": list(self._budget.switches)}
        return best

    def _plans_record(self, taken: dict[str, float]) -> dict[str, dict[str, Any]]:
        """Rank 0, the trial record's part per measured plan: its label, the planner options that made it
        (:func:`trial_options`), what it was planned on (:func:`planned_on`; the plan profiling ran: at start-up, as the
        turns keep it under its first name where a trial plans it again) and its operations, so that two plans of one
        label and options can be told apart."""
        tried = {h: self._tried[h][:2] for h in taken}
        return {"plans": {h: _label(name, plan) for h, (name, plan) in tried.items()},
                "options": {h: trial_options(plan) for h, (_, plan) in tried.items()},
                "planned_on": {h: START_UP if h == self._initial else self._planned_on.get(h, START_UP) for h in tried},
                "operations": {h: len(plan.operations) for h, (_, plan) in tried.items()}}

    def _runoff_plans(self) -> list[str] | None:
        """Rank 0 (others: None), when the rounds end: the plans that take ``runoff_rounds`` more turns
        (:func:`~gradsched.calibration.runoff_plans`).  Over loopback a window's median moves by
        5-10%, and three windows did not tell PyTorch's DDP at the user's size from one bucket
        4-8% faster over 191 rounds of the bench (docs/autotune.md)."""
        if not self._is_root:
            return None
        return runoff_plans(self._taken(), self._baseline(), self.config.runoff_margin, RUNOFF_PLANS)

    def _taken(self) -> dict[str, float]:
        """Rank 0: what each trial candidate measured so far (its median)."""
        return self.measurements.taken(self._trial_candidates)

    def _baseline(self) -> str | None:
        """What a trial plan must beat by ``min_gain``: what the user would run otherwise, PyTorch's DDP at their
        bucket size (:attr:`TunedModel.ddp_bucket_cap_mb`), or DDP's buckets on the executor without it."""
        return baseline_of({h: t[:2] for h, t in self._tried.items()}, self._model.ddp_bucket_cap_mb)

    def _resized(self, baseline: str | None, taken: dict[str, float]) -> set[str]:
        """The candidates that are the baseline with other bucket sizes: PyTorch's DDP, when the baseline is."""
        return resized_of({h: t[:2] for h, t in self._tried.items()}, baseline, taken)

    def _record(self, plan_hash: str, window: list[StepRecord]) -> None:
        """Rank 0: add ``window``'s iterations to what ``plan_hash`` measured (the latest
        :data:`SAMPLES_KEPT`); its measurement is their median."""
        self.measurements.record(plan_hash, (s.duration_s for s in window))

    def _window(self, n: int) -> list[StepRecord]:
        """The last ``n`` finished iterations measured under the current plan."""
        return [s for s in self._steps if s.measured and s.end_s is not None][-n:]

    def _switch(self, step: int, strategy: str, plan: Plan, order: list[int], predicted: float | None,
                measured_before: float | None, reason: str) -> None:
        """Every rank: run ``plan`` from this iteration on (its prediction becomes the current one)."""
        self._model.switch_plan(plan, order)
        self.predicted_iteration_s = predicted
        self._recent_s.clear()
        self.switches.append(Switch(step, strategy, plan.hash, predicted, measured_before, reason))

    def _retune(self, step: int, window: list[StepRecord], reason: str) -> None:
        """Every rank: finish outstanding work, send rank 0 the issue times; rank 0 plans; all switch."""
        self._model.synchronize()
        mine = issue_times(self._events(), window)
        peers = gather_object(mine, self._root, self._model.group, self._model.timeout_s,
                              "auto: gathering the ranks' issue times")
        payload = None
        if self._is_root:
            measured = statistics.median(s.duration_s for s in window)
            if reason != "replan":  # a re-plan's window ran with every completion stamped: slower than the plan runs
                self._record(self._model.plan().hash, window)  # what the plan being left achieved
            payload = self._plan(window, measured, peers, reason)
        self._apply(step, self._broadcast(payload), reason)
        if reason == "profiled":
            self._profiled_at = step
        # Stamping every completion slows the plan it measures (Tracer.completions); what comes
        # next (trials, checks) needs only iteration times, so it stops until the next re-plan.
        self._tracer.completions = self._keep_events
        if self._trial_turns:
            self._next_trial = step + self.trial_window + 1
            self._window_len = self.trial_window
            if self._is_root and self.config.budgeted:  # profiling and planning count against the trials
                now = self._tracer.now()
                since_s = self._start_s if self._profile_start_s is None else self._profile_start_s
                self._budget = TrialBudget(self.config.trial_share, self._start_s, now - since_s,
                                           step - (self._profile_from or 0))
                self._window_start = (now, step)
                if self._model.plan().hash == self._baseline():  # back from profiling (after the planning): a switch
                    self._switch_back = (step, now)
        else:
            if reason == "profiled":
                self._settled(step, "without trials" if self.config.trials <= 1 else "no other plan to try")
            self._schedule_check(step, after_replan=reason == "replan")

    def _schedule_check(self, step: int, after_replan: bool = False) -> None:
        # on PyTorch's DDP the checks (and their broadcasts) stop: what runs costs DDP's time alone; held
        # (hold_checks), only a re-plan's plan, which ran in no trial, is checked
        self._checking_replan = after_replan  # the next check is a re-plan's plan's
        if self.held_from is not None and not after_replan:
            self._next_check = None
            return
        self._next_check = next_check(step, self.config, self.replans, after_replan, is_torch_ddp(self._model.plan()))

    @property
    def _byte_scale(self) -> int:
        """S where the model is a byte-scaled stand-in (the planner option ``byte_scale``), else 1."""
        return int(self.config.planner_options.get("byte_scale", 1))

    @property
    def _is_root(self) -> bool:
        return self._model.rank == 0

    def _broadcast(self, payload: Any) -> Any:
        return broadcast_object(payload, self._root, self._model.group, self._model.timeout_s,
                                "auto: rank 0's broadcast of its decision")

    def _plan(self, window: list[StepRecord], measured_s: float, peers: list[IssueTimes] | None,
              reason: str) -> dict[str, Any]:
        """Rank 0: measurements -> profile, cluster -> the auto plan, its issue order and prediction
        (and, at the first plan, the runners-up to measure: :attr:`AutoTuneConfig.trials`)."""
        from gradsched.planners import make_plan
        from gradsched.planners.auto import Ranked, as_auto, ranked
        from gradsched.planners.registry import byte_scaled_options
        from gradsched.sim import simulate
        from gradsched.torch.runtime.planning import issue_order

        model = self._model
        t0 = time.perf_counter()
        events = self._events()
        profile = measured_profile(model.profile, events, window)
        cluster = self._fit(events, window, peers)
        exclude = tuple(self.config.planner_options.get("exclude", ())) + tuple(r for r in self.rejected
                                                                             if r != TORCH_DDP)
        opts = dict(self.config.planner_options, exclude=exclude)
        def runs(candidates: list[Ranked]) -> list[Ranked]:
            return runnable(candidates, model.has_optimizer())

        results = runs(ranked(profile, cluster, **opts))
        plan = as_auto(results[0], len(results))
        order = issue_order(plan, profile, cluster)
        predicted = results[0].predicted_s
        # the simulator's error on the plan these measurements were taken under, carried to the new one
        measured_plan_s = simulate(model.plan(), profile, cluster, timeline=False).iteration_s
        expected = predicted * measured_s / measured_plan_s if measured_plan_s > 0 else predicted

        def with_defaults(strategy: str) -> Ranked:  # its sizes divided on a byte-scaled stand-in (byte_scale)
            default = make_plan(strategy, profile, cluster, **byte_scaled_options(strategy, {}, self._byte_scale))
            return Ranked(simulate(default, profile, cluster, timeline=False).iteration_s, strategy, default)

        trials: list[Ranked] = []
        given: list[Ranked] = []  # the given profile's best plans among the trials
        if reason == "profiled" and self.config.trials > 1:
            offline = runs(ranked(*self._offline, **opts)) if self._offline is not None else None
            trials = trial_candidates(results, self.config, with_defaults, offline)
            given = (offline or [])[:OFFLINE_TRIALS]
            trials += self._torch_ddp_trials(profile, cluster)
            trials = not_clearly_slower(results[0], trials,
                                        PREDICTED_SLOWER if self.config.budgeted else PREDICTED_FAR_SLOWER)
        trial_plans = [(r.strategy, r.plan if r.strategy == TORCH_DDP else as_auto(r, len(results)), r.predicted_s)
                       for r in trials]
        if trials:  # the trial record's
            self._planned_on = planned_on(plan.hash, [(tp.hash, any(r is g for g in given))
                                                      for r, (_, tp, _) in zip(trials, trial_plans)])
        # the initial plan takes turns too (trials come only at the first plan, which leaves the initial one)
        initial_s = measured_plan_s if trials else None
        logger.info("auto: planned %s (%s) from %d measured iterations in %.0f ms: predicted %.2f ms per "
                    "iteration, measured %.2f ms under %s", plan.options["chose"], plan.options["chosen_options"],
                    len(window), (time.perf_counter() - t0) * 1e3, predicted * 1e3, measured_s * 1e3,
                    self.switches[-1].strategy)
        # the trials' window length: set once, from the iterations measured before the first plan
        window = self.config.window_for(measured_s) if reason == "profiled" else self.trial_window
        return {"plan": plan, "order": order, "predicted_s": predicted, "expected_s": expected,
                "measured_s": measured_s, "trial_window": window,
                "profile": profile, "cluster": cluster, "initial_predicted_s": initial_s,
                "trials": [(name, tp, issue_order(tp, profile, cluster), pred) for name, tp, pred in trial_plans]}

    def _fit(self, events: list[Event], window: list[StepRecord], peers: list[IssueTimes] | None) -> Cluster:
        """Rank 0: the collectives' costs to plan with.

        The cluster the user measured (``cluster=`` with ``profile=``, as ``gradsched bench``
        passes what it measured), when it is for this world size: netbench times every size
        in a stream of operations, and a table of those beats a line through the few
        operation sizes the running plan has.  On 2 testbed hosts at 1 Gbit/s (replayed
        GoogLeNet) the in-situ line was optimistic enough that auto's usbyte plan ran 610 ms
        against a prediction of 501; planned from the measured cluster, 498 ms against 488
        (docs/autotune.md).  Otherwise the service times measured so far (and the start-up
        probes, if too few sizes) fitted to a line; the previous fit, or a default, when
        there is nothing to fit."""
        model = self._model
        offline = self._offline[1] if self._offline is not None else None
        if offline is not None and offline.world_size == model.world:
            return offline
        for nbytes, s in service_points(events, window, peers):
            self._points.setdefault(nbytes, deque(maxlen=KEEP_POINTS)).append(s)
        points = {b: list(ts) for b, ts in self._points.items()}
        if len(points) < MIN_SIZES:
            for nbytes, s in self._probes:
                points.setdefault(nbytes, [s])
        if len(points) >= 2:
            return fit_cluster(points, model.world, backend_of(model.group, model.device))
        # every operation finished behind another: nothing to fit; keep what we had
        from gradsched.torch.runtime.planning import default_cluster

        logger.warning("auto: too few measured operation sizes to fit collective costs; planning with %s",
                       "the previous fit" if self.cluster else "a loopback-like default")
        return self.cluster or default_cluster(model.world)

    def _torch_ddp_trials(self, profile: Profile, cluster: Cluster) -> list[Ranked]:
        """Rank 0, at the first plan: PyTorch's own DDP (:mod:`gradsched.torch.runtime.torch_ddp`) at the
        user's bucket size (built as the user's DDP is), at the one the advisor predicts fastest (of its sizes divided
        by ``byte_scale`` on a byte-scaled stand-in) and as one bucket; a size that makes the same buckets as one
        before it is left out."""
        if not self.config.torch_ddp:
            return []
        from gradsched.advise import BUCKETS_MB, best_ddp_bucket_mb
        from gradsched.planners.auto import Ranked
        from gradsched.sim import simulate

        user = self._model.ddp_bucket_cap_mb
        plans = [candidate_plan(profile, cluster, user, default=not self._model.ddp_cap_given)]
        advised = best_ddp_bucket_mb(profile, cluster, tuple(mb / self._byte_scale for mb in BUCKETS_MB))
        plans += [candidate_plan(profile, cluster, cap) for cap in (advised, one_bucket_mb(profile))
                  if cap != user]  # (the pool keeps one PyTorch DDP per size)
        unique: dict[str, Plan] = {}
        for plan in plans:  # the same buckets: the first size named stays
            unique.setdefault(plan.hash, plan)
        return [Ranked(simulate(plan, profile, cluster, timeline=False).iteration_s, TORCH_DDP, plan)
                for plan in unique.values()]

    def _apply(self, step: int, payload: dict[str, Any], reason: str) -> None:
        plan: Plan = payload["plan"]
        self._expected_s = payload.get("expected_s")
        self.profile, self.cluster = payload["profile"], payload["cluster"]
        self.trial_window = payload.get("trial_window", self.trial_window)
        model = self._model
        plan.check(model.profile, "auto plan")
        chose = plan.options.get("chose", plan.strategy)
        self._tried[plan.hash] = (chose, plan, list(payload["order"]), payload["predicted_s"])
        turn = self._turn(plan.hash, payload)
        first = turn[0] if turn else plan.hash
        if turn and self.config.budgeted and self._baseline() in turn:
            # the baseline first: each candidate's window is then compared with it as soon as it ends
            first = self._baseline()
            turn.remove(first)
            turn.insert(0, first)
        name, run, order, predicted = self._tried[first]
        if run.hash != model.plan().hash or order != model.order():
            model.switch_plan(run, order)
        self.predicted_iteration_s = predicted
        self._recent_s.clear()
        self.switches.append(Switch(step, name, run.hash, predicted, payload["measured_s"], reason))
        if turn:
            self._trial_candidates = turn
            self._runoff = None
        # the candidates take turns, trial_rounds times over; the first window starts now
        self._trial_turns = (turn * self.config.trial_rounds)[1:]

    def _turn(self, planned: str, payload: dict[str, Any]) -> list[str]:
        """Every rank, at a plan: the trial candidates in their order (none without trials), the planned plan
        first and the initial plan last; what they measured before is forgotten (only windows taken in turn
        count: the initial's profiling window was its own phase of the machine)."""
        turn = [planned]
        for name, trial_plan, order, predicted in payload.get("trials", []):
            trial_plan.check(self._model.profile, "auto trial plan")
            started_on = self.config.deferred and trial_plan.hash == self.switches[0].plan_hash
            if trial_plan.hash not in self._tried or (started_on and trial_plan.hash not in turn):
                # one plan under two names is measured once; the baseline the job started on (deferred: the same
                # buckets planned again) takes its turns, now with a prediction
                self._tried[trial_plan.hash] = (name, trial_plan, list(order), predicted)
                turn.append(trial_plan.hash)
        if len(turn) == 1:
            return []
        initial = self._initial
        name, initial_plan, initial_order, _ = self._tried[initial]
        self._tried[initial] = (name, initial_plan, initial_order, payload.get("initial_predicted_s"))
        if initial not in turn:
            turn.append(initial)  # the safe default competes on the same terms
        turn = self._capped_turn(turn)
        for h in turn:
            self.measurements.forget(h)
        return turn

    def _capped_turn(self, turn: list[str]) -> list[str]:
        """``turn`` cut to :attr:`AutoTuneConfig.candidates` (0: as it is): the plan chosen and the baseline, then
        the others fastest predicted first, in ``turn``'s order (every rank: the predictions were broadcast)."""
        cap = self.config.candidates
        if not cap or len(turn) <= cap:
            return turn
        must = [turn[0]] + [h for h in (self._baseline(),) if h in turn and h != turn[0]]
        rest = sorted((h for h in turn if h not in must), key=lambda h: (self._tried[h][3] is None,
                                                                         self._tried[h][3] or 0.0, turn.index(h)))
        kept = set(must + rest[:max(0, cap - len(must))])
        return [h for h in turn if h in kept]

    # ------------------------------------------------------------------ measurements
    def _events(self) -> list[Event]:
        tracer = self._tracer
        with tracer._lock:  # completion callbacks append from the backend's threads
            return list(tracer.events)

    def _trim(self) -> None:
        """Forget events older than the oldest iteration still kept (unless the user traces)."""
        if self._keep_events or not self._steps:
            return
        cutoff = self._steps[0].start_s
        tracer = self._tracer
        with tracer._lock:
            tracer.events = [e for e in tracer.events if e.start_s >= cutoff]

    def _probe(self) -> list[tuple[int, float]]:
        """Median time of a few all-reduces per size in ``PROBE_BYTES`` (all ranks take part)."""
        group = self._model.group
        device = self._model.device
        out = []
        for nbytes in PROBE_BYTES:
            buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
            times = []
            for rep in range(4):
                t0 = time.perf_counter()
                wait(dist.all_reduce(buf, group=group, async_op=True), self._model.timeout_s,
                     "auto: a start-up probe all-reduce", self._model.rank)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if rep:  # the first aligns the ranks
                    times.append(time.perf_counter() - t0)
            out.append((nbytes, statistics.median(times)))
        return out

    # ------------------------------------------------------------------ reporting
    @property
    def trials_done(self) -> bool:
        """The first plan is made and its trials (if any) are decided (the same on every rank)."""
        return self._profiled_at is not None and self._next_trial is None

    @property
    def tuning_iterations(self) -> int:
        """Iterations until every scheduled decision is made (:meth:`AutoTuneConfig.tuning_iterations_for`), with
        the trial windows rank 0 set at the first plan (the same on every rank from then on)."""
        return self.config.tuning_iterations_for(self.trial_window)

    @property
    def done(self) -> bool:
        """Nothing is left to decide: the trials are over and no check or re-plan is scheduled (the same on
        every rank).  On PyTorch's DDP the wrapper then stops calling :meth:`on_iteration_start`, so that
        what runs costs DDP's time alone."""
        return (self.trials_done and self._next_check is None and self._next_replan is None
                and self._next_control is None)

    @property
    def measured_iteration_s(self) -> float | None:
        """Median measured iteration time on this rank since the last switch (None before any)."""
        return statistics.median(self._recent_s) if self._recent_s else None

    def summary(self) -> dict[str, Any]:
        """JSON-ready state: switches, prediction and this rank's measurements."""
        return {"predicted_iteration_s": self.predicted_iteration_s, "expected_iteration_s": self._expected_s,
                "settled_at": self.settled_at, "profiling_from": self._profile_from, "profiled_at": self._profiled_at,
                "measured_iteration_s": self.measured_iteration_s, "replans": self.replans,
                "held_from": self.held_from, "trial_decision": self.trial_decision,
                "switches": [s.to_dict() for s in self.switches],
                "checks": [{"iteration": c.iteration, "measured_s": c.measured_s, "predicted_s": c.predicted_s,
                            "expected_s": c.expected_s, "replan": c.replan, "action": c.action}
                           for c in self.checks]}
