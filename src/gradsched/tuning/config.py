"""Run-time ``auto``'s configuration: what it measures, when, and by which rules it keeps a plan.

Torch-free (the planning core): :class:`AutoTuneConfig` is parsed from the ``plan_options``
of ``"auto"`` (``gradsched train --opt KEY=VALUE``) and read by the runtime's driver,
:class:`gradsched.torch.runtime.autotune.AutoTuner`; the options are described in
docs/autotune.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradsched.errors import GradschedError
from gradsched.options import Option, check, coerce
from gradsched.tuning.candidates import CANDIDATE_SIZES, TORCH_DDP

if TYPE_CHECKING:
    from gradsched.cluster import Cluster
    from gradsched.planners.auto import Ranked

# The options of "auto" that go to the auto planner (AutoTuneConfig.planner_options): every option the planner
# declares (gradsched.planners.auto.OPTIONS) but density, which decides whether auto adapts (tests/test_tuning.py)
PLANNER_KEYS = ("channels", "exclude", "hierarchical", "slack", "byte_scale")
PROBE_BYTES = (8 << 10, 256 << 10, 2 << 20)  # start-up probes, used only when the initial plan has too few sizes
MIN_SIZES = 3  # distinct operation sizes wanted for a line fit
KEEP_POINTS = 9  # service times kept per operation size (most recent)
OFFLINE_TRIALS = 1  # best plans of a given profile and cluster added to the trials
SAMPLES_KEPT = 200  # iteration times kept per plan tried (most recent): its measurement is their median
MAX_TRIAL_WINDOW = 64  # measured iterations of one trial window at most (AutoTuneConfig.window_for)
RUNOFF_PLANS = 4  # plans in the run-off at most, the baseline among them (AutoTuner._runoff_plans)
PREDICTED_SLOWER = 0.25  # budgeted trials skip candidates predicted this much slower than the fastest prediction
PREDICTED_FAR_SLOWER = 1.0  # trials back to back (no budget) skip those predicted this much slower: twice the time



@dataclass(frozen=True, kw_only=True)
class AutoTuneConfig:
    """How ``"auto"`` tunes at run time (see the module docstring)."""

    adaptive: bool = True  # False: plan "auto" once at start-up, like any other strategy
    switch_iteration: int = 5  # iterations under `initial` before the first plan (iteration 0 is a warm-up)
    initial: str = "wfbp"  # the safe default that runs while profiling
    initial_options: dict[str, Any] = field(default_factory=dict)
    trials: int = 3  # best predicted plans (one per strategy) measured before settling; 1: trust the simulator;
    # 0 ("off"): no trials and, unless max_replans is given, no re-plans: the plan from the profile and cluster stays
    trial_iterations: int = 12  # iterations each trial plan runs in all (the median of them is its measurement) ...
    trial_rounds: int = 3  # ... in this many windows, the candidates taking turns (see trial_window)
    trial_window_s: float = 0.3  # ... each window at least this long (more iterations where steps are short)
    trial_share: float = 0.01  # the trials cost at most this share of the time trained so far (0: back to back)
    min_gain: float = 0.03  # a trial plan replaces DDP (the baseline) only if it measured at least this much faster
    resize_min_gain: float = 0.01  # ... PyTorch's DDP at another bucket size: at least this much (nothing else differs)
    runoff_rounds: int = 4  # then the plans the rounds could not tell apart take this many more turns (0: none)
    runoff_margin: float = 0.05  # ... those within this fraction of the fastest median, and the baseline
    candidates: int = 0  # plans taking turns in the trials at most (0: all): the plan chosen, the baseline and the
    # others by prediction, fastest first (a replay's short warm-up: gradsched.jobs.startup.SHORT_WARMUP)
    torch_ddp: bool = True  # PyTorch's own DDP takes turns too (user's bucket_cap_mb, the advised one, one bucket)
    defer: bool = True  # budgeted trials: start on PyTorch's DDP, profile once the budget pays (gradsched.tuning.schedule)
    replan_threshold: float = 0.15  # relative |measured - expected| / expected that triggers a re-plan
    patience: int = 10  # iterations per check (the median of this many is compared)
    max_replans: int = 3  # re-plans after the first plan; then no more checks
    planner_options: dict[str, Any] = field(default_factory=dict)  # for the auto planner (PLANNER_KEYS)

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "AutoTuneConfig":
        """Split ``plan_options`` of ``"auto"`` into tuner settings and planner options; check them, each tuner
        setting as :data:`OPTIONS` declares it (a one-line GradschedError naming it)."""
        opts = dict(options or {})
        planner = {k: opts.pop(k) for k in PLANNER_KEYS if k in opts}
        density = opts.pop("density", 1)
        known = {o.name for o in OPTIONS}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise GradschedError(f"unknown option(s) for strategy 'auto': {', '.join(unknown)}; known: "
                                 f"{', '.join(sorted(known | set(PLANNER_KEYS) | {'density'}))}")
        opts = {o.name: trials_option(opts[o.name]) if o is TRIALS else check(f"auto: {o.name}", o, opts[o.name])
                for o in OPTIONS if o.name in opts}
        if opts.get("trials") == 0:  # "don't try": nor re-plan to a plan nobody measured, unless asked to
            opts.setdefault("max_replans", 0)
        from gradsched.planners.registry import check_options

        planner = check_options("auto", planner)  # typed and range-checked as the auto planner declares them
        if density != 1:
            # Sparse plans are planned once at start-up: a run-time switch must not change
            # the numbers, and top-k residuals would not survive it.
            if opts.get("adaptive") is True:
                raise GradschedError(f"auto at run time switches between dense plans only (top-k residuals would "
                                     f"not survive a switch), got density={density} with adaptive=true; "
                                     "drop adaptive=true to plan once at start-up")
            opts["adaptive"] = False
            planner["density"] = density
        cfg = cls(planner_options=planner, **opts)
        cfg._check()
        return cfg

    def check_cluster(self, cluster: "Cluster | None") -> None:
        """Refuse at start-up what the first plan would refuse mid-training: run-time auto plans with the
        cluster given with the profile (``cluster``) or, without one, a one-level line fitted in situ, so
        ``hierarchical=always`` needs a given cluster with a topology (nodes x ranks per node)."""
        if self.adaptive and self.planner_options.get("hierarchical") == "always" and (
                cluster is None or cluster.topology is None):
            raise GradschedError("auto: hierarchical=always needs a cluster with a topology (docs/formats.md) "
                                 "given with the profile (profile= and cluster=); without one run-time auto "
                                 "plans with a one-level fit of its own measurements")

    def _check(self) -> None:
        """What no single option's declaration says: the initial strategy is a known, concrete, dense one."""
        if self.initial == "auto":
            raise GradschedError("auto: initial must be a concrete strategy (the safe default), not 'auto'")
        if self.candidates == 1:
            raise GradschedError("auto: candidates must be 0 (all) or at least 2 (the plan chosen and the baseline)")
        from gradsched.planners import get_planner, is_sparse

        get_planner(self.initial)  # unknown name: an error that lists the known ones
        if is_sparse(self.initial):
            raise GradschedError(f"auto: initial strategy {self.initial!r} compresses gradients; choose a dense one")

    @property
    def budgeted(self) -> bool:
        """The trials run within :attr:`trial_share` of the time trained (rank 0 schedules each window; the
        baseline runs first and between them); otherwise back to back at iterations fixed in advance."""
        return self.trial_share > 0

    @property
    def deferred(self) -> bool:
        """Start on the baseline (PyTorch's DDP at the user's bucket size) and profile only once the trials'
        budget pays for it (:mod:`gradsched.tuning.schedule`): with ``defer``, budgeted trials of more than
        one plan and PyTorch's DDP among them.  Otherwise profiling starts at iteration 0."""
        return self.defer and self.budgeted and self.torch_ddp and self.trials > 1

    @property
    def trial_window(self) -> int:
        """Measured iterations of one trial window at least (one more runs first, for the switch);
        :meth:`window_for` lengthens it where iterations are short."""
        return math.ceil(self.trial_iterations / self.trial_rounds)

    def window_for(self, iteration_s: float) -> int:
        """Measured iterations of one trial window when an iteration takes ``iteration_s``: at least
        :attr:`trial_window`, and enough for ``trial_window_s`` (at most :data:`MAX_TRIAL_WINDOW`)."""
        if self.trial_window_s <= 0 or not iteration_s > 0:
            return self.trial_window
        return max(self.trial_window, min(MAX_TRIAL_WINDOW, math.ceil(self.trial_window_s / iteration_s)))

    @property
    def tuning_iterations(self) -> int:
        """Iterations until every scheduled decision is made, with windows of :attr:`trial_window`."""
        return self.tuning_iterations_for(self.trial_window)

    def tuning_iterations_for(self, window: int) -> int:
        """Iterations until every scheduled decision (switch, trials in windows of ``window``, checks up
        to the re-plan cap) is made."""
        # the first plan and its strategy's default options, the runners-up, at most one plan of a given
        # profile and cluster, PyTorch's DDP at up to three bucket sizes (else DDP's buckets on the executor), the
        # initial plan
        ddps = CANDIDATE_SIZES if self.torch_ddp else 1
        candidates = self.trials + OFFLINE_TRIALS + 2 + ddps if self.trials > 1 else 0
        if self.candidates:
            candidates = min(candidates, self.candidates)
        runoff = RUNOFF_PLANS * self.runoff_rounds if candidates else 0  # at most: only if the rounds were close
        # per re-plan a check, then a measuring window; the last re-plan's plan is checked once more
        checks = 2 * self.max_replans + (1 if self.max_replans else 0)
        return self.switch_iteration + 1 + (candidates * self.trial_rounds + runoff + 1) * (window + 1) \
            + checks * (self.patience + 1)


TRIALS = Option("trials", int, 3, low=0, doc="plans measured before settling; 0 or off: none (1: the simulator's "
                                               "choice, with re-plans)")
DEFER = Option("defer", bool, True, doc="start on PyTorch's DDP and profile once the trials' budget pays for it")


def _fraction(name: str, default: float, doc: str) -> Option:
    return Option(name, float, default, low=0, high=1, high_open=True, doc=doc)


# Every setting of AutoTuneConfig (but planner_options), as from_options checks it; defaults as the class's.
OPTIONS: tuple[Option, ...] = (
    Option("adaptive", bool, True, doc="false: plan auto once at start-up, like any other strategy"),
    Option("switch_iteration", int, 5, low=2, doc="iterations under initial before the first plan",
           why="iteration 0 is a warm-up, at least one more is measured"),
    Option("initial", str, "wfbp", doc="the safe default that runs while profiling (a dense strategy)"),
    Option("initial_options", dict, {}, doc="the initial strategy's options"),
    TRIALS,
    Option("trial_iterations", int, 12, low=1, doc="iterations each trial plan runs in all"),
    Option("trial_rounds", int, 3, low=1, doc="windows the trial iterations are split into"),
    Option("trial_window_s", float, 0.3, low=0, doc="seconds a trial window lasts at least"),
    _fraction("trial_share", 0.01, "share of the time trained so far the trials may cost (0: back to back)"),
    _fraction("min_gain", 0.03, "how much faster than the baseline a trial plan must measure to replace it"),
    _fraction("resize_min_gain", 0.01, "the same for PyTorch's DDP at another bucket size"),
    Option("runoff_rounds", int, 4, low=0, doc="more turns for the plans the rounds could not tell apart"),
    Option("candidates", int, 0, low=0, doc="plans taking turns in the trials at most, the plan chosen and the "
           "baseline among them, the others fastest predicted first (0: all)"),
    _fraction("runoff_margin", 0.05, "plans within this fraction of the fastest median take the run-off"),
    Option("torch_ddp", bool, True, doc="PyTorch's own DDP takes turns too"),
    DEFER,
    Option("replan_threshold", float, 0.15, low=0, low_open=True, allow_inf=True,
           doc="relative |measured - expected| / expected that triggers a re-plan"),
    Option("patience", int, 10, low=1, doc="iterations per check"),
    Option("max_replans", int, 3, low=0, doc="re-plans after the first plan"),
)


def trials_option(value: Any) -> int:
    """``trials`` as given (``--opt trials=off``, ``plan_options={"trials": 3}``): a whole number, ``off`` for 0."""
    if value is False or (isinstance(value, str) and value.strip().lower() in ("off", "false", "no", "none")):
        return 0
    try:
        return coerce("auto", TRIALS, value, list)
    except GradschedError as exc:
        raise GradschedError(f"{exc} (or off: no trials)") from None



def not_clearly_slower(best: "Ranked", trials: list["Ranked"], slower: float = PREDICTED_SLOWER) -> list["Ranked"]:
    """The trial candidates worth a window: those predicted within ``slower`` of the fastest prediction
    (:data:`PREDICTED_SLOWER` for budgeted trials, :data:`PREDICTED_FAR_SLOWER` back to back), and DDP's
    buckets whatever their prediction (the baseline, PyTorch's DDP at other bucket sizes, which differ from
    it in their buckets only: over loopback one bucket measured fastest where the simulator had not named
    it, docs/autotune.md).  A plan predicted clearly slower is the simulator's verdict that measuring it is
    likely to cost a window for nothing; back to back, only a plan predicted at twice the fastest is left
    out (DenseNet-201 on 8 emulated hosts: `usbyte` at its defaults, 402 operations, predicted 1.31 s
    against 0.18 s, measured 1.57 s, and its windows took about 210 s of a 588 s warm-up)."""
    fastest_s = min([best.predicted_s] + [r.predicted_s for r in trials])
    return [r for r in trials if r.strategy in (TORCH_DDP, "ddp") or r.predicted_s <= fastest_s * (1 + slower)]
