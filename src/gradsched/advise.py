"""The bucket advisor: what to set in stock tools, and what switching to gradsched would buy.

Most users keep PyTorch DDP (directly, through the Hugging Face Trainer, or DeepSpeed)
and only choose a bucket size.  :func:`advise` simulates each tool's bucketing rule at a
sweep of bucket sizes on a measured profile and network, picks the fastest predicted,
and sets it beside the tool's default and gradsched's best plan (``auto``).

- PyTorch DDP ``bucket_cap_mb`` (MiB): the ``ddp`` strategy (DDP's own rule: buckets
  in the order gradients become ready, tensors never split, a bucket closes once it
  reaches its cap).  Left at its default, DDP caps the first bucket at 1 MiB and the
  others at 25 MiB; set, the cap applies to the first bucket too (PyTorch's
  ``_BucketCapacityConfig``; releases before that distinction capped the first bucket at
  1 MiB whatever the setting: ``ddp_first_bucket_mb=1``).
- Hugging Face ``TrainingArguments(ddp_bucket_cap_mb=...)``: passed to DDP as is, the
  same number.
- DeepSpeed ZeRO ``reduce_bucket_size`` (a number of *elements*, 5e8 by default: its
  docs say "Number of elements reduced/allreduced at a time"): a bucket collects
  gradients in backward order and is reduced before a tensor would overflow it.  It is
  simulated as all-reduces of those buckets; ZeRO-2's reduce-scatter moves less than an
  all-reduce, so its predicted time is an upper bound (docs/advise.md).

Torch-free: it runs on a saved profile and cluster (``gradsched advise``) or on what
``gradsched.torch.advise`` measures in a live process group."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from gradsched.cluster import Cluster
from gradsched.constants import MiB
from gradsched.errors import GradschedError
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

BUCKETS_MB = (1, 2, 5, 10, 15, 25, 35, 50, 75, 100, 150, 250, 500)  # DDP bucket_cap_mb values tried
DDP_DEFAULT_MB = 25.0
DDP_DEFAULT_FIRST_MB = 1.0  # DDP's first bucket when bucket_cap_mb is left at its default
DEEPSPEED_DEFAULT_ELEMENTS = 500_000_000
# Predictions this close to the best are a tie: the simulator's median absolute error against
# measured runs was 3.4% (docs/simulator.md, "Fidelity"), and differences between bucket
# sizes of one model on one network err less than absolute times; 2% is a judgement, not a fit.
NEAR = 0.02
PlanCheck = Callable[[Plan], "str | None"]  # None: the plan runs on the model; else why it cannot


@dataclass(frozen=True)
class Point:
    """One bucket size of one tool and its simulated iteration (``predicted_idle_s``: the same
    without the cluster's contention figures; None when it has none)."""

    bucket_mb: float
    predicted_s: float
    operations: int
    predicted_idle_s: float | None = None


@dataclass(frozen=True)
class Advice:
    """The advised settings with their predicted iteration times (seconds)."""

    model: str
    world_size: int
    ddp_bucket_cap_mb: float
    ddp_predicted_s: float
    ddp_default_s: float
    deepspeed_reduce_bucket_size: int  # elements
    deepspeed_predicted_s: float
    deepspeed_default_s: float
    gradsched_strategy: str  # what auto chose
    gradsched_predicted_s: float
    element_bytes: int
    ddp_sweep: list[Point] = field(default_factory=list)
    deepspeed_sweep: list[Point] = field(default_factory=list)
    gradsched_overlaps_forward: bool = False  # the plan steps the optimizer during the next forward
    gradsched_rejected: list[str] = field(default_factory=list)  # faster plans plan_check refused: "name: why"

    @property
    def ddp_near_best_mb(self) -> list[float]:
        """DDP bucket sizes whose worst-case regret (:func:`regrets`) is within ``NEAR`` of the
        advised one's: the prediction cannot tell them apart, so measuring them is the way to
        choose among them.  Without contention figures: predicted within ``NEAR`` of the advised."""
        r = regrets(self.ddp_sweep)
        advised = r[self.ddp_bucket_cap_mb]
        return [p.bucket_mb for p in self.ddp_sweep if r[p.bucket_mb] <= advised * (1 + NEAR)]

    def settings(self) -> dict[str, dict[str, Any]]:
        """What to set, per tool."""
        mb = _mb_setting(self.ddp_bucket_cap_mb)
        return {"torch.nn.parallel.DistributedDataParallel": {"bucket_cap_mb": mb},
                "transformers.TrainingArguments": {"ddp_bucket_cap_mb": mb},
                "deepspeed zero_optimization": {"reduce_bucket_size": self.deepspeed_reduce_bucket_size}}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["settings"] = self.settings()
        d["ddp_near_best_mb"] = self.ddp_near_best_mb
        d["speedup_ddp_advised_vs_default"] = self.ddp_default_s / self.ddp_predicted_s
        d["speedup_gradsched_vs_ddp_advised"] = self.ddp_predicted_s / self.gradsched_predicted_s
        return d


def advise(profile: Profile, cluster: Cluster, buckets_mb: tuple[float, ...] = BUCKETS_MB,
           channels: int = 1, ddp_first_bucket_mb: float | None = None,
           plan_check: PlanCheck | None = None) -> Advice:
    """Simulate each tool's bucketing at ``buckets_mb`` (and its default) and return the advice.

    ``ddp_first_bucket_mb``: None for PyTorch's rule (a set ``bucket_cap_mb`` caps the
    first bucket too); a number for a DDP whose first bucket always has that size.
    Each tool's advice is its fastest size, or, where the cluster has contention figures,
    the size of least worst-case regret with and without them (:func:`least_regret`).
    ``plan_check(plan)``: None when the plan runs on the model, else why not; gradsched's
    best plan is then the fastest of ``auto``'s candidates it accepts (:func:`best_plan`)."""
    if not buckets_mb or any(not mb > 0 for mb in buckets_mb):
        raise GradschedError(f"advise: bucket sizes must be positive megabytes, got {list(buckets_mb)}")
    if ddp_first_bucket_mb is not None and not ddp_first_bucket_mb > 0:
        raise GradschedError(f"advise: the first DDP bucket must be positive megabytes, got {ddp_first_bucket_mb}")
    sizes = sorted(set(float(mb) for mb in buckets_mb))
    eb = _gradient_element_bytes(profile)

    def ddp(mb: float, first_mb: float | None = ddp_first_bucket_mb) -> Point:
        plan = ddp_plan(profile, cluster, mb, first_mb)
        return _point(plan, mb, profile, cluster, channels)

    def deepspeed(mb: float) -> Point:
        return _point(deepspeed_plan(profile, int(mb * MiB) // eb), mb, profile, cluster, channels)

    ddp_sweep = [ddp(mb) for mb in sizes]
    ds_sweep = [deepspeed(mb) for mb in sizes]
    best_ddp, best_ds = least_regret(ddp_sweep), least_regret(ds_sweep)
    ds_default = _point(deepspeed_plan(profile, DEEPSPEED_DEFAULT_ELEMENTS), DEEPSPEED_DEFAULT_ELEMENTS * eb / MiB,
                        profile, cluster, channels)
    auto, auto_s, rejected = best_plan(profile, cluster, channels, plan_check)
    return Advice(profile.model, cluster.world_size, best_ddp.bucket_mb, best_ddp.predicted_s,
                  ddp(DDP_DEFAULT_MB, DDP_DEFAULT_FIRST_MB).predicted_s, int(best_ds.bucket_mb * MiB) // eb, best_ds.predicted_s,
                  ds_default.predicted_s, auto.options.get("chose", "auto"), auto_s, eb, ddp_sweep, ds_sweep,
                  auto.overlap_forward, rejected)


def best_plan(profile: Profile, cluster: Cluster, channels: int = 1,
              plan_check: PlanCheck | None = None) -> tuple[Plan, float, list[str]]:
    """``auto``'s plan, its predicted iteration and the faster candidates ``plan_check`` refused.

    Without a check: ``auto``'s own choice.  With one: ``auto``'s candidates fastest first,
    the first the check accepts (``ddp``'s buckets run on any model, so one always is)."""
    if plan_check is None:
        auto = make_plan("auto", profile, cluster, channels=channels)
        return auto, simulate(auto, profile, cluster, channels=channels, timeline=False).iteration_s, []
    from gradsched.planners.auto import as_auto, ranked

    everything = ranked(profile, cluster, channels=channels)
    rejected: list[str] = []
    for choice in everything:
        why = plan_check(choice.plan)
        if why is None:
            return as_auto(choice, len(everything)), choice.predicted_s, rejected
        rejected.append(f"{choice.strategy}: {why}")
    raise GradschedError(f"advise: no plan of auto's candidates runs on this model ({rejected[0]})")


def regrets(sweep: list[Point]) -> dict[float, float]:
    """Each size's worst-case regret: its predicted time over the sweep's best, with the
    cluster's contention figures and without them (an idle network), whichever is worse.

    Why both: the figures decide whether overlapping communication with backward (small
    buckets) or one bucket after it wins, yet they move from job to job far more than the
    machine does (vgg at 1 Gbit/s measured a compute slowdown of 0.68 in one job, 0.10 in
    the next at 250 Mbit/s, on the same machine; docs/advise.md), and taken alone they
    advised the one size that measured 14% slower than the best."""
    best = min(p.predicted_s for p in sweep)
    idle = [p.predicted_idle_s for p in sweep if p.predicted_idle_s is not None]
    out = {}
    for p in sweep:
        r = p.predicted_s / best
        if p.predicted_idle_s is not None and len(idle) == len(sweep):
            r = max(r, p.predicted_idle_s / min(idle))
        out[p.bucket_mb] = r
    return out


def least_regret(sweep: list[Point]) -> Point:
    """The size of least worst-case regret (:func:`regrets`; without contention figures: the
    fastest predicted); ties go to the smaller bucket (less memory, earlier overlap)."""
    r = regrets(sweep)
    return min(sweep, key=lambda p: (r[p.bucket_mb], p.bucket_mb))


def ddp_plan(profile: Profile, cluster: Cluster, bucket_cap_mb: float, first_bucket_mb: float | None = None) -> Plan:
    """PyTorch DDP's buckets for ``DistributedDataParallel(model, bucket_cap_mb=...)``: the
    first bucket capped at ``first_bucket_mb``, or, None, at ``bucket_cap_mb`` as PyTorch
    does once the cap is set (left unset, DDP's default: 1 MiB first, then 25 MiB)."""
    first = bucket_cap_mb if first_bucket_mb is None else first_bucket_mb
    return make_plan("ddp", profile, cluster, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first)


def best_ddp_bucket_mb(profile: Profile, cluster: Cluster, buckets_mb: tuple[float, ...] = BUCKETS_MB,
                       channels: int = 1) -> float:
    """The DDP ``bucket_cap_mb`` of ``buckets_mb`` :func:`advise` would set (a set cap caps the
    first bucket too; least worst-case regret, ties: the smaller): its DDP setting alone
    (run-time ``auto`` measures PyTorch's DDP at it)."""
    return least_regret([_point(ddp_plan(profile, cluster, float(mb)), float(mb), profile, cluster, channels)
                         for mb in sorted(set(buckets_mb))]).bucket_mb


def deepspeed_plan(profile: Profile, bucket_elements: int) -> Plan:
    """DeepSpeed ZeRO's gradient buckets: in backward order, a bucket is reduced before a
    tensor would take it past ``bucket_elements`` (a tensor larger than that goes alone)."""
    if bucket_elements < 1:
        raise GradschedError(f"advise: reduce_bucket_size must be at least 1 element, got {bucket_elements}")
    groups: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in profile.order:
        numel = profile.tensors[i].numel
        if current and filled + numel > bucket_elements:
            groups.append(current)
            current, filled = [], 0
        current.append(i)
        filled += numel
    if current:
        groups.append(current)
    return Plan("deepspeed-buckets", whole_tensor_ops(groups, profile), profile.fingerprint, profile.model,
                {"reduce_bucket_size": bucket_elements})


def _point(plan: Plan, mb: float, profile: Profile, cluster: Cluster, channels: int) -> Point:
    result = simulate(plan, profile, cluster, channels=channels, timeline=False)
    idle = None
    if cluster.contention is not None:
        idle = simulate(plan, profile, replace(cluster, contention=None), channels=channels, timeline=False).iteration_s
    return Point(mb, result.iteration_s, len(plan.operations), idle)


def _gradient_element_bytes(profile: Profile) -> int:
    """The element size of most gradient bytes (DeepSpeed counts elements, DDP bytes)."""
    by_size: dict[int, int] = {}
    for t in profile.tensors:
        by_size[t.element_bytes] = by_size.get(t.element_bytes, 0) + t.bytes
    return max(by_size, key=lambda eb: (by_size[eb], eb))


def _mb_setting(mb: float) -> float | int:
    return int(mb) if float(mb).is_integer() else mb


def format_advice(advice: Advice) -> str:
    """The advice as the command prints it."""
    ms = 1e3
    a = advice
    mb = _mb_setting(a.ddp_bucket_cap_mb)
    lines = [f"gradsched advise: {a.model or 'model'}, {a.world_size} workers (times predicted by simulation)",
             "",
             f"  {'setting':<52} {'iteration':>10}  {'vs DDP default':>14}",
             f"  {'PyTorch DDP default (bucket_cap_mb=25)':<52} {a.ddp_default_s * ms:>8.1f} ms  {1.0:>13.2f}x"]

    def row(label: str, s: float) -> str:
        return f"  {label:<52} {s * ms:>8.1f} ms  {a.ddp_default_s / s:>13.2f}x"

    lines.append(row(f"PyTorch DDP bucket_cap_mb={mb} (advised)", a.ddp_predicted_s))
    lines.append(row("DeepSpeed default (reduce_bucket_size=5e8)", a.deepspeed_default_s))
    lines.append(row(f"DeepSpeed reduce_bucket_size={a.deepspeed_reduce_bucket_size} (advised)",
                     a.deepspeed_predicted_s))
    lines.append(row(f"gradsched best plan (auto: {a.gradsched_strategy})", a.gradsched_predicted_s))
    lines += ["", "Set:",
              f"  DistributedDataParallel(model, bucket_cap_mb={mb})",
              f"  TrainingArguments(..., ddp_bucket_cap_mb={mb})",
              f'  DeepSpeed config: "zero_optimization": {{"reduce_bucket_size": {a.deepspeed_reduce_bucket_size}}}'
              f"  (elements; {a.element_bytes}-byte gradients)",
              "",
              f"DDP bucket sizes predicted within {NEAR:.0%} of the advised one (a tie for the simulator): "
              f"{', '.join(f'{_mb_setting(mb)}' for mb in a.ddp_near_best_mb)} MiB.",
              *([] if a.ddp_sweep[0].predicted_idle_s is None else
                ["With contention figures the advice is the size nearest the best both with them and without "
                 "them (an idle network): they move from job to job (docs/advise.md)."]),
              *_gradsched_lines(a)]
    return "\n".join(lines)


def _gradsched_lines(a: Advice) -> list[str]:
    """What switching to gradsched would buy, and how to ask for a plan that runs on the model."""
    excluded = sorted({r.partition(":")[0] for r in a.gradsched_rejected} - {a.gradsched_strategy})
    how = f'plan="auto", plan_options={{"exclude": {excluded}}}' if excluded else 'plan="auto"'
    lines = [f"Switching to gradsched (`gradsched.torch.DistributedDataParallel(model, {how})`) is predicted "
             f"{a.ddp_predicted_s / a.gradsched_predicted_s:.2f}x the advised DDP setting."]
    if a.gradsched_rejected:
        more = len(a.gradsched_rejected) - 3
        lines.append(f"Faster plans that cannot run on this model were left out: {'; '.join(a.gradsched_rejected[:3])}"
                     + (f" (and {more} more)" if more > 0 else "") + ".")
    elif a.gradsched_overlaps_forward:
        lines.append("gradsched's best plan steps the optimizer during the next forward (with DistributedOptimizer); "
                     "gradsched.torch.advise(model, batch) checks that it runs on your model.")
    return lines
