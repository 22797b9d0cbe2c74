"""``gradsched bench``'s domain rules, torch-free: what to run, how far emulation stays faithful,
what fits in memory, and the result in emulated seconds.

The command (:mod:`gradsched.commands.bench`) parses the flags, calls these, launches the
workers (:mod:`gradsched.jobs.launch`) and prints; the workers
(:mod:`gradsched.torch.jobs.bench_worker`) read a :class:`~gradsched.jobs.config.BenchConfig`
and return a :class:`~gradsched.jobs.results.BenchResult` in run seconds, which
:func:`finish` converts once (:func:`gradsched.jobs.results.to_emulated`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradsched.constants import REPLAY_PREFIX
from gradsched.errors import GradschedError
from gradsched.jobs.config import BenchEntry
from gradsched.jobs.results import BenchResult, to_emulated
from gradsched.options import check
from gradsched.replayable import check_replayable, load_profile
from gradsched.sparsity import DENSITY

if TYPE_CHECKING:
    from gradsched.cluster import Cluster
    from gradsched.profile import Profile

# Emulation stays faithful while the links' aggregate shaped rate (rate / dilation x hosts)
# is at most this: above it the 2 cores cannot move gloo's bytes at the links' rate.  Measured
# (benchmarks/replay_fidelity.py, docs/bench.md "Emulated compute"): all-reduce of 4-64 MiB
# within 2% of the rate's line at 2 x 1gbit, 1.3-3x off at 4 x 1gbit, 2 x 2gbit and above.
FAITHFUL_AGGREGATE_BPS = 2 * 10**9
DDP_DEFAULT_MB = 25.0  # PyTorch DDP's bucket_cap_mb: the "ddp" row


def _bucket_label(mb: str) -> str:
    return "ddp-all" if mb == "all" else f"ddp-{mb}mb"


def _strategy_entry(name: str, density: float | None, chosen: dict[str, Any]) -> BenchEntry:
    from gradsched.planners import is_sparse

    options: dict[str, Any] = {}
    if is_sparse(name):
        options["density"] = density
    if name == "auto":
        # run-time auto: profiles itself, plans, and checks its choice against what it
        # measured (reverting a plan that runs slower than one it already ran); the
        # worker lets it settle off the clock before the counted rounds
        options["max_replans"] = 2
    if chosen and name == "ddp":
        raise GradschedError("--opt: the ddp row is PyTorch's own DDP; give its bucket sizes with --ddp-buckets")
    options.update(chosen)
    return BenchEntry(label=name, strategy=name, torch_ddp=name == "ddp", options=options or None)


def _bucket_mb(raw: str) -> float:
    if raw == "all":
        return 1e6  # larger than any model here: one bucket after DDP's 1 MiB first one
    try:
        mb = float(raw)
    except ValueError:
        raise GradschedError(f"--ddp-buckets {raw!r}: expected megabytes or 'all'") from None
    if mb <= 0:
        raise GradschedError(f"--ddp-buckets: bucket sizes must be positive, got {raw}")
    return mb


FSDP2_ROW = "fsdp2"  # --strategies fsdp2: PyTorch FSDP2, fully_shard on each block and the root (docs/bench.md)


def entries(strategies: str, buckets: str, density: float | None = None,
            options: Mapping[str, dict[str, Any]] | None = None) -> list[BenchEntry]:
    """What to run: one entry per strategy, plus one per DDP bucket size (DDP's default 25 MB is ``ddp``).

    Sparse strategies (``topk``, ``omgs``) run at ``density``, which they require;
    ``auto`` stays dense (compare it with the sparse rows).  ``options``: each strategy's
    planner options from ``--opt``, typed and checked (:func:`gradsched.commands.bench.entries`)."""
    from gradsched.planners import is_sparse, strategy_names

    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        raise GradschedError("--strategies is empty; name at least one, e.g. ddp,auto")
    known = strategy_names()
    if density is not None:
        density = check("--density", DENSITY, density)  # in (0, 1], as every user of the density declares it
    out: list[BenchEntry] = []
    for name in names:
        if name == FSDP2_ROW:  # PyTorch's fully_shard per block, beside the plans (not a gradsched strategy)
            if not any(e["label"] == name for e in out):
                out.append(BenchEntry(label=name, strategy=name, torch_ddp=False, fsdp2=True))
            continue
        if name not in known:
            raise GradschedError(f"strategy {name!r} is unknown; known: {', '.join(known)} (and the row "
                                 f"{FSDP2_ROW}: PyTorch's fully_shard per block)")
        if is_sparse(name) and density is None:
            raise GradschedError(f"strategy {name!r} sends top-k gradients: give its density, e.g. --density 0.01")
        if not any(e.label == name for e in out):
            out.append(_strategy_entry(name, density, dict((options or {}).get(name) or {})))
    if buckets.strip().lower() in ("", "none"):
        return out
    if not any(e.label == "ddp" for e in out):
        out.insert(0, BenchEntry(label="ddp", strategy="ddp", torch_ddp=True))  # the reference is always run
    for raw in (b.strip().lower() for b in buckets.split(",") if b.strip()):
        mb = _bucket_mb(raw)
        if mb == DDP_DEFAULT_MB and raw != "all":
            continue  # DDP's default: that is the "ddp" row
        label = _bucket_label(raw if raw == "all" else f"{mb:g}")
        if not any(e.label == label for e in out):
            out.append(BenchEntry(label=label, strategy="ddp", torch_ddp=True, ddp_kwargs={"bucket_cap_mb": mb}))
    return out


def shaped_rate(rate: str | None, hosts: int, dilate: float, replay: bool, scale: int = 1) -> int | None:
    """Bits per second to shape each testbed link at: ``rate / dilate / scale`` (``scale``: --scale-bytes),
    refused beyond what the machine moves faithfully (``FAITHFUL_AGGREGATE_BPS`` over all hosts' links)."""
    from gradsched.testbed import format_rate, parse_rate_bps

    if not dilate >= 1 or not math.isfinite(dilate):
        raise GradschedError(f"--dilate must be a number at least 1, got {dilate:g}")
    if dilate != 1 and not replay:
        raise GradschedError("--dilate stretches replayed compute: use it with --replay PROFILE")
    if rate is None:
        if dilate != 1:
            raise GradschedError("--dilate scales the testbed's links: give --rate (as root), not --loopback")
        return None
    bps = int(parse_rate_bps(rate) / dilate / scale)
    if replay and bps * hosts > FAITHFUL_AGGREGATE_BPS:
        need = parse_rate_bps(rate) / scale * hosts / FAITHFUL_AGGREGATE_BPS
        raise GradschedError(f"--rate {rate} over {hosts} hosts at --dilate {dilate:g} shapes {hosts} links at "
                             f"{format_rate(bps)}, above the {format_rate(FAITHFUL_AGGREGATE_BPS)} in all that this "
                             f"machine moves faithfully (docs/bench.md): use --dilate {math.ceil(need * 10) / 10:g} "
                             f"or more")
    return bps


def excluded(options: dict[str, Any] | None) -> list[str]:
    """The strategies an ``auto`` row's ``exclude`` option names (a list, or a comma-separated string)."""
    names = (options or {}).get("exclude") or ()
    return [x.strip() for x in names.split(",")] if isinstance(names, str) else list(names)


def unmeasured_phases_excluded(options: dict[str, Any], measured: Collection[str], in_situ: bool) -> dict[str, Any]:
    """``auto``'s options planned at start-up (not ``in_situ``) with ``dear`` excluded where the network table
    did not time the reduce-scatter and all-gather (``measured``: its collectives; it times them only where a
    row runs them, :func:`~gradsched.torch.jobs.bench_network.network_collectives`): derived from the
    all-reduce (as half of it each, BERT-Large's ``auto`` on 8 emulated hosts took ``dear`` at 1.93 s predicted
    and ran 3.15 s, 0.69x DDP, ``benchmarks/results/emulate_papers_bert_large_8h_start8.json``; at today's
    measured ratios, :meth:`~gradsched.cluster.Cluster.derived_phase_ratio`, re-predicted 2.80 s) they are a
    fit to past runs, not this job's network.  Run-time ``auto`` keeps it among its candidates: it measures
    what it tries."""
    if in_situ or {"reducescatter", "allgather"} <= set(measured) or "dear" in excluded(options):
        return options
    return {**options, "exclude": [*excluded(options), "dear"]}


def runs_two_phase(rows: list[BenchEntry]) -> bool:
    """Whether a row may run reduce-scatters and all-gathers on gradsched's runtime: a ``dear`` row, or ``auto``
    (run-time or planned) unless ``dear`` is among its ``exclude``: their buffers beside the arena
    (:func:`gradsched.bench_memory.two_phase_bytes`)."""
    for e in rows:
        if e.torch_ddp or e.fsdp2:
            continue
        if e.strategy == "dear" or (e.strategy == "auto" and "dear" not in excluded(e.options)):
            return True
    return False


def byte_scale(replay: str | None, ranks: int, given: float | None, shaped: bool,
               two_phase: bool = False) -> tuple[int, str | None]:
    """The replay's byte scale (``--scale-bytes``, else the smallest that passes the memory admission,
    :func:`gradsched.bench_memory.check_memory`, ``two_phase`` as :func:`runs_two_phase` says; 1 without a
    replay) and, when it picked one above 1, the line that says so."""
    from gradsched.byte_scaling import check_scale, pick_scale

    checked = check_scale(given) if given is not None else None
    if replay is None:
        if checked is not None:
            raise GradschedError("--scale-bytes shrinks a replayed profile's tensors: use it with --replay PROFILE")
        return 1, None
    profile = load_profile(replay)
    check_replayable(profile)
    scale = pick_scale(profile, ranks, checked, shaped, two_phase)
    if checked is not None or scale == 1:
        return scale, None
    return scale, (f"{profile.total_bytes / 1e6:.0f} MB of parameters on {ranks} ranks do not fit this machine's "
                   f"memory: replaying at --scale-bytes {scale}, the smallest that fits")


def replay_model(source: str, dilate: float, out_dir: str, scale: int = 1) -> tuple[str, Profile]:
    """The model name the workers build for ``--replay source`` (its profile, times x
    ``dilate``, tensors / ``scale``, written into ``out_dir``) and the profile as given."""
    from gradsched.byte_scaling import scale_profile

    profile = load_profile(source)
    check_replayable(profile)
    path = Path(out_dir, "replay.profile.json")
    scale_profile(profile.with_times(dilate), scale).save(path)
    return f"{REPLAY_PREFIX}{path}", profile


def anchored_to_probe(cluster: Cluster, nbytes: int, measured_s: float) -> tuple[Cluster, float]:
    """``cluster`` with its all-reduce table's bandwidth term scaled so that ``nbytes`` take ``measured_s``, and
    the factor (1: unchanged): the contention probe's all-reduce of every gradient, alone (its median over
    the start-up and the samples between the rounds, in run seconds), is the size the rows move and is
    timed more often than the network table's large sizes, which are timed once at start-up (at 8 hosts
    under load, ResNet-50's table ran 20% above it and above the rounds, which ran as the probe did:
    docs/bench.md).  The latency term and the table's small sizes keep what the network table measured."""
    import dataclasses

    from gradsched.costs import with_line

    cost = cluster.cost("allreduce")
    table_s, beta_s = cost.time_s(nbytes), cost.beta_s_per_byte * nbytes
    if not (nbytes > 0 and measured_s > 0 and table_s > 0 and beta_s > 0):
        return cluster, 1.0
    # with_line scales the table size by size by the ratio of the lines: solve for the new line through measured_s
    k = (measured_s * (cost.alpha_s + beta_s) / table_s - cost.alpha_s) / beta_s
    if not (math.isfinite(k) and k > 0):
        return cluster, 1.0
    anchored = with_line(cost, cost.alpha_s, cost.beta_s_per_byte * k)
    return dataclasses.replace(cluster, collectives={**cluster.collectives, "allreduce": anchored}), k


# How a queued all-reduce's start-up and bytes combine where ranks share cores ((L**p + (b*B)**p)**(1/p), p this;
# None: the longer of the two, as the queue measured alone, allreduce_queue_stream_8h.json).  p = 2 from err9 to err10,
# chosen on the first 8-host run of each of the papers' models (their load not recorded); in the quiet 8-host jobs since
# (the 1-minute load at most 5.5 at their end) the longer predicts their rows at 1.2% / 10.9% against 1.9% / 17.1%,
# runs11's first five (held out; their 29 rows but four two-phase ones) 1.4% / 8.8% against 3.2% / 18.1%
# (docs/notes/2026-12-err11.md).
STREAM_EXPONENT: float | None = None
# Where ranks share cores a training step queues its all-reduces (two in flight on gloo's threads), which overlap
# their start-ups: the stream's start-up is the table's (a blocking stream's) 4 KiB time divided by this.  Measured
# alone on 8 testbed hosts, a queue below the knee cost 0.83-0.95x the blocking stream a small all-reduce (median
# gain 1.10; allreduce_queue_stream_8h_q12.json).  Chosen on the quiet 8-host jobs before runs12 (108 all-reduce rows:
# median |error| 1.41% -> 1.14%, worst 13.4% -> 11.7%, over 8% 6 -> 3); held out on runs12's and lead12's (42 rows:
# 1.60% / 14.1% (6) -> 1.37% / 11.2% (3)); docs/notes/2026-12-ops13.md.  1.0: the table's start-up as it is.
STREAM_QUEUE_GAIN = 1.15


def with_stream_cost(cluster: Cluster, nbytes: int, measured_s: float, cores: int,
                     exponent: float | None = STREAM_EXPONENT, queue_gain: float = STREAM_QUEUE_GAIN) -> Cluster:
    """``cluster`` with its ``allreduce_stream`` where its ranks share this machine's ``cores`` (more ranks than
    cores): a plan's all-reduce costs its start-up or its bytes, whichever is longer (or the two blended: ``exponent``,
    below)
    (:meth:`Cluster.operation_cost`; docs/cost-model.md, "Start-up or bytes"), the latency the all-reduce table's
    time at its smallest size (sampled again between the rounds where the bench resamples the table) and the
    seconds a byte those of the contention probe's all-reduce of every gradient, alone (``measured_s`` for
    ``nbytes``, as :func:`anchored_to_probe` takes them).  The table times its sizes in a blocking stream, each
    operation's start-up on top of its bytes; a training step queues them (two in flight on gloo's threads),
    and on 8 testbed hosts sharing 2 cores a queued all-reduce cost its start-up or its bytes, whichever is
    longer (``benchmarks/allreduce_queue_stream.py``): its start-up is the ring's hand-offs waiting for a core,
    which overlap the bytes on the links.  Re-predicted over the kept runs (``benchmarks/predict_fixes.py``) it
    halved the worst error of the papers' models on 8 hosts; with a rank per core (2 hosts here) the start-up
    is paid on top of the bytes (many-operation plans predicted 4-8% further under), so it is left out there.
    ``exponent`` p costs an operation ``(L**p + (b*B)**p)**(1/p)``, the two blended near the knee (None, the bench's
    :data:`STREAM_EXPONENT`: the longer of the two).  The longer predicts the quiet 8-host jobs (median |error| 1.2%,
    worst 10.9%); in jobs run beside other sessions' work the small operations cost more than either figure, and p = 2
    left fewer rows over 8% there (7 against 13; median 2.4% against 3.2%: docs/notes/2026-12-err11.md).
    ``queue_gain`` (the bench's :data:`STREAM_QUEUE_GAIN`, recorded in the stream): the latency is the table's
    divided by it, what a queued all-reduce's start-up costs (on runs12's DenseNet-201 its 52 all-reduces of 153 KB
    went from 14.1% to 4.0% over).  Unchanged where either figure is missing."""
    import dataclasses

    from gradsched.cluster import STREAM

    cost = cluster.cost("allreduce")
    latency_s = cost.time_s(cost.points[0][0]) if cost.points else cost.alpha_s
    if cluster.world_size <= cores or not (nbytes > 0 and measured_s > 0 and latency_s > 0
                                            and math.isfinite(measured_s / nbytes)):
        return cluster
    stream: dict[str, float] = {"latency_s": latency_s / queue_gain, "s_per_byte": measured_s / nbytes}
    if queue_gain != 1.0:
        stream["queue_gain"] = queue_gain
    return dataclasses.replace(cluster, extra={**cluster.extra,
                                               STREAM: stream if exponent is None else {**stream, "exponent": exponent}})


def probe_alone_s(samples: Collection[float], ranks: int, cores: int) -> float:
    """The contention probe's all-reduce of every gradient, alone (run seconds), as :func:`anchored_to_probe` and
    :func:`with_stream_cost` take it: where the job's ``ranks`` outnumber this machine's ``cores``, the least of its
    samples (start-up and between the rounds), as the network table reads each size (``monotone_envelope``: on a
    shared machine timing noise only adds time); else their median, as before.  At 8 emulated hosts on 2 cores a
    loaded sample sets the median in some jobs (ResNet-50's runs9: 150-155 ms quiet, 183-203 ms loaded, median 183;
    every row then predicted 10-12% over, its one all-reduce of all gradients too); over the stored 8-host runs of
    the papers' models the least predicts their rows at median |error| 2.2% against 2.9% (worst unchanged: a row
    whose rounds spread 85%).  At 4 hosts it cost 0.6 points of median (1.9% to 2.5%), at 2 (a rank per core) 0.4, so
    there the median stays (docs/notes/2026-12-err10.md).  Empty: 0 (no anchor)."""
    if not samples:
        return 0.0
    return min(samples) if ranks > cores else statistics.median(samples)


def with_phase_ratios(cluster: Cluster) -> Cluster:
    """``cluster`` with ``derived_phase_ratios`` set, for each of the reduce-scatter and all-gather its table did not
    time and the file gives no ratio for, to the ratio measured alone on such a network
    (:func:`gradsched.costs.measured_phase_ratio`: gloo 1.56 and 1.75 at 8 ranks, netbench at the 8-host runs'
    links), not the fitted :data:`gradsched.costs.DERIVED_PHASE_RATIOS` that files without the field keep (2.0
    each at 8 ranks, fitted on lines refitted below 2 MiB, 22-33% less a byte than the bench's).  The bench's
    line, anchored to its probe, is the reading those ratios are taken against; with them the six stored 8-host
    ``dear`` plans re-predict at median |error| 7.3%, worst 17.3% (2.0 on the same reading: 24.4%, worst 38.4%;
    docs/notes/2026-12-err10.md); where the ratio is known by the group's size (gloo at 8 ranks: 0.74-0.81 at
    256 KiB, 1.21-1.28 at 1 MiB, the flat ratios from 2 MiB: :data:`gradsched.costs.MEASURED_PHASE_RATIO_POINTS`) also
    ``derived_phase_ratio_points``, which this version prices by (older ones keep the flat ratios).  Those ratios
    price the all-to-alls; where rings run (gloo beyond two ranks) the
    cluster also records ``ring_min_bytes``, the runtime's threshold as this job runs it
    (:func:`gradsched.costs.ring_min_bytes`), so that it is re-read as run if the default moves.  Unchanged on a
    backend with none measured."""
    import dataclasses

    from gradsched.costs import PER_RANK, measured_phase_ratio, measured_phase_ratio_points, ring_min_bytes

    given = dict(cluster.extra.get("derived_phase_ratios") or {})
    derived = [name for name in PER_RANK if name not in cluster.collectives]
    ratios = {name: measured_phase_ratio(cluster.backend, cluster.world_size, name)
              for name in derived if name not in given}
    found = {name: r for name, r in ratios.items() if r is not None}
    extra = {**cluster.extra, "derived_phase_ratios": {**given, **found}} if found else dict(cluster.extra)
    by_size = {name: [[b, r] for b, r in points] for name in found
               if (points := measured_phase_ratio_points(cluster.backend, cluster.world_size, name))}
    if by_size and "derived_phase_ratio_points" not in extra:
        extra["derived_phase_ratio_points"] = by_size
    if "ring_min_bytes" not in extra and any(cluster.ring_phase_ratio(name) is not None for name in derived):
        extra["ring_min_bytes"] = ring_min_bytes()
    return dataclasses.replace(cluster, extra=extra) if extra != cluster.extra else cluster


def ddp_first_bucket_mb(ddp_kwargs: Mapping[str, Any] | None, explicit_cap_has_no_first_bucket: bool) -> float:
    """PyTorch DDP's first bucket, in MiB, for a row's ``ddp_kwargs``: 1 MiB where ``bucket_cap_mb`` is its default
    (not given); where it is given, torch 2.13 makes the first bucket as large as the others
    (``explicit_cap_has_no_first_bucket``: its ``_BucketCapacityConfig``), older versions 1 MiB."""
    cap = (ddp_kwargs or {}).get("bucket_cap_mb")
    if cap is None or not explicit_cap_has_no_first_bucket:
        return 1.0
    return float(cap)


def with_bound_checks(result: BenchResult) -> BenchResult:
    """``result`` with each row's ``below_bound``: None, or the assumption of the lower bound the row
    broke by running below it, and why (:func:`gradsched.calibration.bounds.below_bound`)."""
    from gradsched.calibration.bounds import below_bound

    for row in result["rows"]:
        density = (row.get("plan_options") or {}).get("density")
        sparse = isinstance(density, (int, float)) and density < 1
        row["below_bound"] = below_bound(row, result["lower_bound"], result.get("compute_only"),  # type: ignore
                                         sparse=sparse)
    return result


def finish(raw: dict[str, Any], dilate: float) -> BenchResult:
    """The workers' ``bench.json`` (run seconds) as the user reads it: emulated seconds, bound checks."""
    return with_bound_checks(to_emulated(raw, dilate))  # type: ignore[arg-type]


def history_job(model: str, hosts: int, ranks_per_host: int, network: str, rate: str | None, batch_size: int,
                dilate: float | None) -> dict[str, Any]:
    """What an earlier job's figures must match to pool with this one's (``--contention-from``)."""
    job: dict[str, Any] = {"model": model, "hosts": hosts, "ranks_per_host": ranks_per_host, "network": network,
                           "rate": rate, "batch_size": batch_size}
    if dilate is not None:
        job["dilate"] = dilate  # links and compute are stretched alike only within one dilation
    return job
