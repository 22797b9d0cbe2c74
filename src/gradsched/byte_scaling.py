"""Byte scaling for a replayed bench: tensors S times smaller on links S times slower.

``gradsched bench --replay PROFILE --scale-bytes S`` divides every tensor's element
count by ``S`` (:func:`scale_profile`) and shapes the links at ``rate / S``
(:func:`scaled_bps`), so that each operation's bandwidth term, bytes / rate, keeps its
emulated time while the memory and the cores' copying shrink S-fold: a model that
does not fit this machine replays at its real communication times.

Every size the bench is given or uses is the emulated model's and divided by S too
(:func:`scale_entries`): PyTorch DDP's bucket caps, the planners' options in bytes, MiB
or MB (given with ``--opt`` or at their defaults) and ``auto``'s candidates (its
``byte_scale`` option), so that each row plans the operations it would plan for the
model emulated, each as long.

What is not scaled: the per-message latency (``alpha``: each operation's start-up,
gloo's handshakes) is the same on the scaled links, so an operation's latency share
is S times larger relative to its bytes than in the run emulated; PyTorch DDP's 1 MiB
first bucket (where ``bucket_cap_mb`` is left at its default; the scaled ``ddp`` row gives
25/S, and torch 2.13 then makes the first bucket as large); the runtimes' per-byte
host work (copies into buckets, the optimizer, gloo's sums and the kernel's copies through
the links) shrinks S-fold with the bytes.  The
simulator's predictions use the cluster measured on the scaled links and the scaled
profile, so they compare like with like.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gradsched.errors import GradschedError
from gradsched.profile import Profile, TensorProfile

MAX_SCALE = 1 << 12  # the largest S the bench picks or takes


def add_scale_arg(parser: Any) -> None:
    """``--scale-bytes S`` on ``gradsched bench``'s parser."""
    parser.add_argument("--scale-bytes", type=float, default=None, metavar="S",
                        help="with --replay on the testbed: every tensor 1/S of its elements and links shaped at "
                        "rate/S, so that each operation's bandwidth time is kept while memory shrinks S-fold "
                        "(per-message latency is not scaled); every size given or used is the emulated model's and "
                        "divided by S too (--ddp-buckets, --opt sizes such as usbyte.unit_bytes, the planners' "
                        "defaults, auto's candidates), but PyTorch DDP's own 1 MiB first bucket; default: 1, or the "
                        "smallest power of two that fits this machine's memory")


def check_scale(scale: float) -> int:
    """``--scale-bytes`` as an integer from 1 to :data:`MAX_SCALE`, else a one-line error."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale == int(scale)
            and 1 <= scale <= MAX_SCALE):
        raise GradschedError(f"--scale-bytes must be a whole number from 1 to {MAX_SCALE}, got {scale:g}")
    return int(scale)


def scale_profile(profile: Profile, scale: int) -> Profile:
    """``profile`` with every tensor's element count divided by ``scale`` (rounded, at least 1), its
    element width and every time as they were."""
    if scale == 1:
        return profile
    tensors = []
    for t in profile.tensors:
        numel = max(1, round(t.numel / scale))
        tensors.append(TensorProfile(t.name, numel, numel * t.element_bytes, t.forward_s, t.backward_s, t.layer,
                                     t.update_s))
    extra = {**profile.extra, "scale_bytes": scale}
    return Profile(profile.model, tuple(tensors), profile.ready_order, profile.other_s, extra, profile.op_host)


def scaled_bps(bps: int, scale: int) -> int:
    """The shaped link rate for ``bps`` emulated at byte scale ``scale``."""
    return max(1, int(bps / scale))


def smallest_fitting_scale(fits: Callable[[int], bool], given: int | None) -> int:
    """``given`` when there is one (the caller checks that it fits), else the smallest power of two S for which
    ``fits(S)`` holds (1 when the model fits as it is); a one-line error when none up to :data:`MAX_SCALE` does."""
    if given is not None:
        return given
    scale = 1
    while scale <= MAX_SCALE:
        if fits(scale):
            return scale
        scale *= 2
    raise GradschedError(f"the model does not fit this machine's memory even at --scale-bytes {MAX_SCALE}: "
                         "use fewer hosts or ranks per host")


def pick_scale(profile: Profile, ranks: int, given: int | None, shaped: bool, two_phase: bool = False) -> int:
    """The byte scale of a replay of ``profile`` on ``ranks`` ranks: ``given`` (checked to fit), else 1 if the
    model fits this machine's memory, else the smallest power of two that fits (on shaped links only);
    ``two_phase``: a row runs reduce-scatters and all-gathers (:func:`gradsched.bench_memory.check_memory`)."""
    from gradsched.bench_memory import check_memory

    def need(scale: int) -> None:
        scaled = scale_profile(profile, scale)
        check_memory(scaled.total_bytes, max(t.bytes for t in scaled.tensors), ranks, two_phase=two_phase)

    def fits(scale: int) -> bool:
        try:
            need(scale)
        except GradschedError:
            return False
        return True

    if given is not None and given > 1 and not shaped:
        raise GradschedError("--scale-bytes shapes the links at rate / S: run on the testbed (as root, with --rate)")
    if given is not None or fits(1) or not shaped:
        need(given or 1)  # the memory check's own error where it does not fit
        return given or 1
    return smallest_fitting_scale(fits, None)


DDP_DEFAULT_BUCKET_MB = 25.0


def scale_ddp_entries(entries: list[dict], scale: int) -> list[dict]:
    """The bench's rows with PyTorch DDP's bucket sizes divided by ``scale``: a 25 MB bucket of the
    emulated model holds 25/S MB of the scaled one.  Not scaled: DDP's first bucket, 1 MiB where
    ``bucket_cap_mb`` is left at its default; torch 2.13 gives an explicit cap no smaller first bucket,
    so the scaled ``ddp`` row's first bucket is 25/S MB, the emulated model's 25 MB."""
    if scale == 1:
        return entries
    out = []
    for e in entries:
        if e.get("torch_ddp"):
            kw = dict(e.get("ddp_kwargs") or {})
            kw["bucket_cap_mb"] = float(kw.get("bucket_cap_mb", DDP_DEFAULT_BUCKET_MB)) / scale
            e = {**e, "ddp_kwargs": kw}
        out.append(e)
    return out


def scale_entries(entries: list[dict], scale: int) -> list[dict]:
    """The bench's rows for a replay at byte scale ``scale``: every size in them is the emulated model's, and
    divided by ``scale``.  PyTorch DDP's bucket caps (:func:`scale_ddp_entries`); a gradsched row's planner
    options in bytes, MiB or MB, given with ``--opt`` or at their defaults
    (:func:`~gradsched.planners.registry.byte_scaled_options`: US-Byte's and ByteScheduler's 4 MiB units,
    ``merge_bytes``, DeAR's ``threshold_mb`` ...); ``auto`` gets ``byte_scale`` S, which divides its
    candidates' sizes (its grid and the strategies' defaults) and, at run time, the DDP bucket sizes its
    advisor tries.  So each row plans the operations it would for the emulated model, each as long."""
    if scale == 1:
        return entries
    from gradsched.planners.registry import byte_scaled_options

    out = []
    for e in scale_ddp_entries(entries, scale):
        if not e.get("torch_ddp") and not e.get("fsdp2"):
            opts = dict(e.get("options") or {})
            opts = {**opts, "byte_scale": scale} if e["strategy"] == "auto" else byte_scaled_options(
                e["strategy"], opts, scale)
            e = {**e, "options": opts}
        out.append(e)
    return out
