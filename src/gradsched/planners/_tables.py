"""What many planners read of a profile's tensors, made once per profile (``auto`` plans one profile
some thirty times): each tensor's element size and bytes, and its whole :class:`~gradsched.plan.Slice`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from gradsched.plan import DENSE, Operation, Slice, new_operation, whole_slices
from gradsched.profile import Profile


@dataclass(frozen=True)
class TensorTable:
    element_bytes: list[int]  # per tensor
    nbytes: list[int]  # per tensor
    whole: list[Slice]  # per tensor: all its elements (slices are immutable: plans share them)
    one_size: bool  # every tensor of one element size
    position: np.ndarray  # int64, per tensor: its place in the ready order (profile.order)


_TABLES: list[tuple[Profile, TensorTable]] = []  # the last few profiles, by identity


def tensor_table(profile: Profile) -> TensorTable:
    """``profile``'s :class:`TensorTable` (kept for the last few profiles)."""
    for known, table in _TABLES:
        if known is profile:
            return table
    tensors = profile.tensors
    elem = [t.bytes // t.numel for t in tensors]
    position = np.empty(len(tensors), dtype=np.int64)
    position[np.array(profile.order, dtype=np.int64)] = np.arange(len(tensors), dtype=np.int64)
    table = TensorTable(elem, [t.bytes for t in tensors], whole_slices(profile), len(set(elem)) <= 1, position)
    _TABLES.insert(0, (profile, table))
    del _TABLES[4:]
    return table


def whole_ops(groups: Iterable[Iterable[int]], profile: Profile) -> tuple[Operation, ...]:
    """:func:`gradsched.plan.whole_tensor_ops` of dense operations (equal operations), from the profile's
    table: no new slices, no dataclass ``__init__`` per operation."""
    whole = tensor_table(profile).whole
    return tuple(new_operation(tuple([whole[t] for t in g]), DENSE, j) for j, g in enumerate(groups))
