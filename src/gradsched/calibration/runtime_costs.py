"""A profile measured alone -> the profile of a step under a data-parallel runtime (``gradsched bench``).

The profiler times the model's compute alone; a runtime adds copies into buckets,
a buffer broadcast and its own host time per operation, which the bench's probe
measures.  :func:`calibrate` rescales the profile to a measured step,
:func:`with_runtime_costs` adds what each runtime costs on top.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gradsched.profile import Profile


def calibrate(profile: Profile, compute_s: float) -> Profile:
    """``profile`` with every compute time scaled so that one iteration's compute is ``compute_s``.

    The profile gives the shape (which layer costs what, when each gradient is ready);
    a measured whole step gives the scale."""
    if compute_s <= 0 or profile.compute_s <= 0:
        return profile
    return profile.with_times(compute_s / profile.compute_s)


def with_runtime_costs(profile: Profile, probe: dict[str, Any] | None, torch_ddp: bool) -> Profile:
    """``profile`` plus what a data-parallel runtime adds to every step on the compute stream.

    - Bucket passes (:meth:`Profile.with_bucket_costs`): both runtimes copy each
      gradient into its bucket and scale it in the gradient-ready hook (gradsched's
      executor because ``zero_grad()`` drops its bucket views each step); PyTorch DDP
      (``gradient_as_bucket_view=False``, its default) also copies the result back
      after the all-reduce, while gradsched's executor hands out views of the buckets.
    - The broadcast of rank 0's buffers before every forward (both, by default): into
      ``other_s``, which runs where that broadcast does, between the update and the
      next forward.
    - gradsched's host time per operation (``torch.jobs.bench_overheads._RuntimeOverheads.op_host``), into the
      profile's ``op_host``: PyTorch DDP issues its few buckets from C++, and whatever
      that costs is in its overhead below.  With it the wall time of one deferred update of an
      overlapping plan with every rank at it (``probe["update_call_s"]``), charged even where
      the host's work is hidden: on 8 emulated hosts sharing 2 cores, those updates doubled a
      rank's host time and about doubled the step (docs/notes/2026-12-bench-runs.md).
    - The rest of the runtime's own cost per step, measured on its simplest plan
      (``torch.jobs.bench_overheads._RuntimeOverheads``): into ``other_s`` too.

    A model whose compute is emulated on a clock that hides the host's own work
    (``probe["host_work_hidden"]``: :mod:`gradsched.torch.jobs.replay`) takes neither the
    bucket passes nor the host time per operation: that work runs beside the emulated
    device, as it would beside a GPU, and only its contention with communication (in the
    cluster's contention figures) and the measured overhead remain."""
    if probe is None or not probe.get("allreduce_bytes"):
        return profile
    out = profile
    if not probe.get("host_work_hidden"):
        per_byte = 1.0 / probe["allreduce_bytes"]
        out = out.with_bucket_costs((probe["bucket_copy_s"] + probe["bucket_scale_s"]) * per_byte,
                                    probe["bucket_copy_s"] * per_byte if torch_ddp else 0.0)
        if not torch_ddp and probe.get("op_host"):
            out = out.with_op_host(probe["op_host"]["issue_s"], probe["op_host"]["retire_s"],
                                   probe.get("update_call_s", 0.0))
    elif not torch_ddp and probe.get("update_call_s"):  # host work hidden, but not an overlapping plan's updates
        out = out.with_op_host(0.0, 0.0, probe["update_call_s"])
    overhead = (probe.get("runtime_overhead_s") or {}).get(runtime_name(torch_ddp), 0.0)
    return dataclasses.replace(out, other_s=out.other_s + probe.get("buffer_sync_s", 0.0) + overhead)


def runtime_name(torch_ddp: bool) -> str:
    """How the bench names a runtime (its rows' ``runs`` and the keys of ``runtime_overhead_s``)."""
    return "torch DDP" if torch_ddp else "gradsched"
