"""Shared bucketing rule for size-capped strategies (``ddp``, ``threshold``)."""

from __future__ import annotations

from typing import Iterator

from gradsched.planners._tables import tensor_table
from gradsched.profile import Profile


def buckets_by_size(profile: Profile, caps_bytes: Iterator[float]) -> list[list[int]]:
    """Walk tensors in ready order, closing a bucket once it reaches the current cap.

    This is PyTorch DDP's ``compute_bucket_assignment_by_size``: a tensor is never
    split, a bucket closes when its size reaches the cap (so it may exceed it by
    one tensor), the next bucket gets the next cap, and tensors of different
    element sizes (dtypes) fill separate buckets.  Buckets are listed in the order
    they close; the ones still open at the end follow."""
    open_: dict[int, tuple[list[int], int]] = {}
    cap_of: dict[int, float] = {}
    closed: list[list[int]] = []
    table = tensor_table(profile)
    elem, nbytes = table.element_bytes, table.nbytes
    for i in profile.order:
        eb = elem[i]
        if eb not in cap_of:
            cap_of[eb] = next(caps_bytes)
        members, size = open_.get(eb, ([], 0))
        members.append(i)
        size += nbytes[i]
        if size >= cap_of[eb]:
            closed.append(members)
            open_.pop(eb, None)
            cap_of[eb] = next(caps_bytes)
        else:
            open_[eb] = (members, size)
    closed.extend(members for members, _ in open_.values())
    return closed
