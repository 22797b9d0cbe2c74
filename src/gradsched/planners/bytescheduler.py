"""``bytescheduler``: ByteScheduler's equal blocks, front-layer-first priority, credit window.

Every tensor is cut into blocks of at most ``partition_bytes`` (default: 1M fp32
elements); each block is one operation whose priority is its tensor's forward index
(closest to the input first).  At most ``credit_bytes`` are issued but unfinished at
a time, and the next forward of a layer waits only for that layer's blocks."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import Plan, block_operations
from gradsched.planners import _collective as coll
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile


MAX_OPERATIONS = 10_000_000  # more blocks than this is a typo in partition_bytes, not a plan
OPTIONS = (
    Option("partition_bytes", int, 4 << 20, low=1, high=1 << 50, doc="largest block in bytes", size=True),
    Option("credit_bytes", int, None, low=1, high=1 << 60, optional=True,
           doc="bytes issued but unfinished at a time (default: two blocks)", size=True),
    coll.OPTION,
)


@register("bytescheduler", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, partition_bytes: int = 4 << 20,
         credit_bytes: int | None = None, hierarchical: str = "auto") -> Plan:
    coll.check_mode("bytescheduler", hierarchical, cluster)
    credit = 2 * partition_bytes if credit_bytes is None else credit_bytes
    blocks = count_blocks(profile, partition_bytes)
    if blocks > MAX_OPERATIONS:
        raise GradschedError(f"bytescheduler: partition_bytes={partition_bytes} cuts this model into {blocks:,} "
                             f"blocks (at most {MAX_OPERATIONS:,}); {_remedy(profile, partition_bytes)}")
    blocks_ = _blocks(profile, partition_bytes)
    kinds = coll.collectives_for([b[3] for b in blocks_], cluster, hierarchical)
    # Operation((Slice(i, start, end),), kind, i) each, made without the dataclasses' __init__ (auto makes three)
    ops = tuple(block_operations((i, start, end, kind, i) for (i, start, end, _), kind in zip(blocks_, kinds)))
    options = coll.recorded({"partition_bytes": partition_bytes, "credit_bytes": credit}, cluster, hierarchical)
    return Plan("bytescheduler", ops, profile.fingerprint, profile.model, options,
                scheduling="priority", overlap_forward=True, credit_bytes=credit)


def _blocks(profile: Profile, partition_bytes: int) -> list[tuple[int, int, int, int]]:
    """(tensor, start, end, bytes) of every block, tensors in forward order, each cut front to back."""
    out: list[tuple[int, int, int, int]] = []
    tensors = profile.tensors
    for i in profile.order:
        t = tensors[i]
        numel, elem = t.numel, t.bytes // t.numel
        step = max(1, partition_bytes // elem)
        whole = numel // step
        full = step * elem
        out.extend((i, start, start + step, full) for start in range(0, whole * step, step))
        if numel > whole * step:
            out.append((i, whole * step, numel, (numel - whole * step) * elem))
    return out


def count_blocks(profile: Profile, partition_bytes: int) -> int:
    """How many blocks (operations) ``partition_bytes`` cuts ``profile``'s tensors into."""
    return sum(-(-t.numel // max(1, partition_bytes // t.element_bytes)) for t in profile.tensors)


def _remedy(profile: Profile, partition_bytes: int) -> str:
    """What to do about too many blocks: the smallest power of two above ``partition_bytes`` that
    fits (never the value that failed), or why none can."""
    if len(profile.tensors) > MAX_OPERATIONS:
        return (f"the model has {len(profile.tensors):,} tensors, more than any partition_bytes allows; "
                "use another strategy")
    size = 1 << max(partition_bytes, -(-profile.total_bytes // MAX_OPERATIONS)).bit_length()  # > partition_bytes
    while count_blocks(profile, size) > MAX_OPERATIONS:
        size *= 2
    return f"give a larger partition_bytes, e.g. {size} ({count_blocks(profile, size):,} blocks)"
