"""Where every gradient element lives in the flat bucket buffers (pure index arithmetic).

One flat buffer ("arena") per element type: gradients of different dtypes never
share a collective (fp32, bf16 and fp16 go in separate buckets).  The arena of each
dtype is the concatenation of the plan's operations, in plan order, each operation's
slices of that dtype in slice order; so every operation is one contiguous *piece*
per dtype, which one collective reduces in place.

A tensor whose slices lie back to back in its arena, in element order (a whole
tensor in one bucket, or a partitioned tensor whose blocks are consecutive), can
have its ``.grad`` be a view into the arena: autograd then accumulates straight into
the bucket and the reduced result is the gradient, with no copy either way.  Any
other tensor is copied into its slots when ready and back when reduced.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradsched.plan import Plan


@dataclass(frozen=True, slots=True)
class Slot:
    """Elements ``[start, end)`` of tensor ``tensor`` live at ``arena_start`` in arena ``dtype``."""

    tensor: int
    start: int
    end: int
    dtype: str
    arena_start: int


@dataclass(frozen=True, slots=True)
class Piece:
    """The contiguous range ``[start, end)`` of one operation in arena ``dtype``: one collective."""

    dtype: str
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Layout:
    arena_numel: dict[str, int]  # dtype -> elements
    op_pieces: tuple[tuple[Piece, ...], ...]  # per operation, one piece per dtype it touches
    op_slots: tuple[tuple[Slot, ...], ...]  # per operation, its slots
    op_tensors: tuple[tuple[int, ...], ...]  # per operation, distinct tensors
    tensor_ops: tuple[tuple[int, ...], ...]  # per tensor, the operations holding it
    view_start: tuple[int | None, ...]  # per tensor: arena offset if its grad can be a view, else None


def build_layout(plan: Plan, dtypes: list[str], numels: list[int], contiguous: list[bool]) -> Layout:
    """Lay ``plan`` out over tensors with element types ``dtypes`` and sizes ``numels``.

    ``contiguous[i]`` says whether tensor ``i`` is stored contiguously (only those may
    have their gradient as a view into a flat buffer)."""
    offset: dict[str, int] = {}
    op_pieces, op_slots, op_tensors = [], [], []
    per_tensor: list[list[Slot]] = [[] for _ in numels]
    tensor_ops: list[list[int]] = [[] for _ in numels]
    for j, op in enumerate(plan.operations):
        by_dtype: dict[str, list[tuple[int, int, int]]] = {}
        for s in op.slices:
            by_dtype.setdefault(dtypes[s.tensor], []).append((s.tensor, s.start, s.end))
        pieces, slots = [], []
        for dt, spans in by_dtype.items():
            begin = offset.get(dt, 0)
            pos = begin
            for t, a, b in spans:
                slot = Slot(t, a, b, dt, pos)
                slots.append(slot)
                per_tensor[t].append(slot)
                pos += b - a
            offset[dt] = pos
            pieces.append(Piece(dt, begin, pos))
        op_pieces.append(tuple(pieces))
        op_slots.append(tuple(slots))
        tensors = tuple(dict.fromkeys(s.tensor for s in op.slices))
        op_tensors.append(tensors)
        for t in tensors:
            tensor_ops[t].append(j)
    view_start: list[int | None] = []
    for i, slots in enumerate(per_tensor):
        slots.sort(key=lambda s: s.start)
        chained = all(b.arena_start == a.arena_start + (a.end - a.start) for a, b in zip(slots, slots[1:]))
        view_start.append(slots[0].arena_start if slots and chained and contiguous[i] else None)
    return Layout(offset, tuple(op_pieces), tuple(op_slots), tuple(op_tensors),
                  tuple(tuple(ops) for ops in tensor_ops), tuple(view_start))
