"""Plan: the ordered communication operations of one iteration (``gradsched.plan/1``).

A plan is what every planner returns, what the simulator predicts and what the
runtime executes.  Each operation is one collective over one or more *slices*
``[tensor_index, start_element, end_element)``; every element of every tensor appears
in exactly one slice.  A whole tensor is one slice; a partitioned tensor (ByteScheduler,
US-Byte) is several slices in several operations; a merged bucket is one operation
with several slices.

How operations are issued:

- ``scheduling = "fifo"``: strictly in list order; an operation waits for the one
  before it to be issued (DDP, WFBP, MG-WFBP).
- ``scheduling = "priority"``: whenever a channel is free, the ready operation with
  the lowest ``priority`` number goes next (ties: list order).  Operations are the
  preemption points: a long tensor split into blocks can be overtaken between blocks.
- ``credit_bytes``: at most that many bytes issued but unfinished (ByteScheduler's
  credit window); ``None`` means one operation at a time per channel.
- ``overlap_forward``: the next iteration's forward of a layer waits only for the
  operations holding that layer's gradients (and their update), not for all of them.

Two-phase (decoupled) operations, DeAR's and ZeRO's: a ``reduce-scatter`` of a merged
group leaves each rank 1/p of the summed gradients; the ``all-gather`` with exactly the
same slices, later in the list, brings the whole group back to every rank.  The
all-gather is issued once its reduce-scatter is done (in list order, as any operation)
and is *gated*: the forward of the layer owning tensor ``gate`` (default: the group's
first layer in forward order) waits for it, whatever ``overlap_forward`` says.  Every
element is reduce-scattered and gathered exactly once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

from gradsched import _validate as v
from gradsched.errors import FormatError
from gradsched.profile import Profile

FORMAT = "gradsched.plan/1"
DENSE = "allreduce"
SPARSE = "topk-allgather"
# A dense all-reduce run in two levels (docs/cost-model.md, "Two-level clusters"): reduce inside each
# node, all-reduce across nodes, broadcast inside each node.  Same result as DENSE.
HIER = "hier-allreduce"
# Decoupled all-reduce (DeAR, ZeRO, FSDP): a reduce-scatter during backward, its all-gather before the
# next forward of the layer it gates.  Both together give every rank the all-reduce's result.
REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"
TWO_PHASE = (REDUCE_SCATTER, ALL_GATHER)
OP_COLLECTIVES = (DENSE, SPARSE, HIER, REDUCE_SCATTER, ALL_GATHER)
SCHEDULING = ("fifo", "priority")
FIELDS = ("format", "strategy", "model", "profile_fingerprint", "options", "scheduling", "overlap_forward",
          "credit_bytes", "operations", "hash")
OPERATION_FIELDS = ("collective", "priority", "slices", "density", "gate")


@dataclass(frozen=True, slots=True)
class Slice:
    """Elements ``[start, end)`` of tensor ``tensor`` (flattened)."""

    tensor: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Operation:
    """One collective over some slices."""

    slices: tuple[Slice, ...]
    collective: str = DENSE
    priority: int = 0
    density: float | None = None  # fraction of elements sent, for topk-allgather
    gate: int | None = None  # all-gather only: the forward of the layer owning this tensor waits for it

    @property
    def sparse(self) -> bool:
        return self.collective == SPARSE

    @property
    def two_phase(self) -> bool:
        """A reduce-scatter or an all-gather (half of a decoupled all-reduce)."""
        return self.collective in TWO_PHASE

    def numel(self) -> int:
        return sum(s.numel for s in self.slices)

    def tensors(self) -> tuple[int, ...]:
        """Distinct tensor indices, in slice order."""
        return tuple(dict.fromkeys(s.tensor for s in self.slices))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"collective": self.collective, "priority": self.priority,
                             "slices": [[s.tensor, s.start, s.end] for s in self.slices]}
        if self.density is not None:
            d["density"] = self.density
        if self.gate is not None:
            d["gate"] = self.gate
        return d


@dataclass(frozen=True)
class Plan:
    """A strategy's operations for one profile, with how to issue them."""

    strategy: str
    operations: tuple[Operation, ...]
    profile_fingerprint: str
    model: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    scheduling: str = "fifo"
    overlap_forward: bool = False
    credit_bytes: int | None = None

    @cached_property
    def hash(self) -> str:
        """Content hash: equal on every rank exactly when the plans are the same."""
        body = self._body()
        body.pop("options", None)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def _body(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": FORMAT, "strategy": self.strategy, "model": self.model,
                             "profile_fingerprint": self.profile_fingerprint, "options": self.options,
                             "scheduling": self.scheduling, "overlap_forward": self.overlap_forward,
                             "credit_bytes": self.credit_bytes,
                             "operations": [op.to_dict() for op in self.operations]}
        return d

    # -------------------------------------------------------------- queries
    def op_bytes(self, profile: Profile) -> list[int]:
        """Bytes each operation moves before compression."""
        return [sum(s.numel * profile.tensors[s.tensor].element_bytes for s in op.slices)
                for op in self.operations]

    def op_ready_s(self, profile: Profile) -> list[float]:
        """When each operation's last gradient is ready, after backward starts."""
        ready = profile.ready_s
        return [max(ready[s.tensor] for s in op.slices) for op in self.operations]

    # -------------------------------------------------------------- validation
    def check(self, profile: Profile, source: str = "<plan>") -> None:
        """Raise FormatError unless this plan fits ``profile`` element for element."""
        if self.profile_fingerprint != profile.fingerprint:
            raise FormatError(source, "profile_fingerprint",
                              f"plan was made for another profile (model {self.model!r}, fingerprint "
                              f"{self.profile_fingerprint}); this profile is {profile.model!r} ({profile.fingerprint})")
        two_phase = any(op.two_phase for op in self.operations)
        if two_phase:
            _check_pairs(self.operations, source)
        n = profile.num_tensors
        per_tensor: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        for j, op in enumerate(self.operations):
            if op.collective == ALL_GATHER:
                continue  # gathers exactly what its reduce-scatter covers (_check_pairs)
            for k, s in enumerate(op.slices):
                where = f"operations[{j}].slices[{k}]"
                if not 0 <= s.tensor < n:
                    raise FormatError(source, where, f"tensor index {s.tensor} is outside 0..{n - 1}")
                numel = profile.tensors[s.tensor].numel
                if s.start < 0 or s.end <= s.start:
                    raise FormatError(source, where, f"empty or reversed range [{s.start}, {s.end})")
                if s.end > numel:
                    raise FormatError(source, where, f"range [{s.start}, {s.end}) overruns tensor {s.tensor} "
                                                     f"({profile.tensors[s.tensor].name}) of {numel} elements")
                per_tensor[s.tensor].append((s.start, s.end, j))
        for t, spans in enumerate(per_tensor):
            name = profile.tensors[t].name
            spans.sort()
            pos = 0
            for start, end, j in spans:
                if start < pos:
                    raise FormatError(source, f"operations[{j}]", f"overlaps elements [{start}, {min(pos, end)}) "
                                                                  f"of tensor {t} ({name}) sent by another slice")
                if start > pos:
                    raise FormatError(source, "operations", f"miss elements [{pos}, {start}) of tensor {t} ({name})")
                pos = end
            if pos < profile.tensors[t].numel:
                raise FormatError(source, "operations", f"miss elements [{pos}, {profile.tensors[t].numel}) "
                                                        f"of tensor {t} ({name})")
        if two_phase:
            for j, op in enumerate(self.operations):
                if op.collective == ALL_GATHER:
                    _check_gate(j, op, profile, source)

    def gathers(self) -> dict[int, int]:
        """Each all-gather's index -> the index of its reduce-scatter (the earlier one, not yet paired,
        with exactly the same slices); an all-gather without one is left out (``check`` rejects it)."""
        open_rs: dict[tuple[Slice, ...], list[int]] = {}
        out: dict[int, int] = {}
        for j, op in enumerate(self.operations):
            if op.collective == REDUCE_SCATTER:
                open_rs.setdefault(op.slices, []).append(j)
            elif op.collective == ALL_GATHER and open_rs.get(op.slices):
                out[j] = open_rs[op.slices].pop(0)
        return out

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        d = self._body()
        d["hash"] = self.hash
        return d

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Plan":
        v.check_format(data, FORMAT, source)
        v.check_fields(data, FIELDS, source, "")
        strategy = v.string(v.require(data, "strategy", source, ""), source, "strategy")
        fp = v.string(v.require(data, "profile_fingerprint", source, ""), source, "profile_fingerprint")
        model = v.string(data.get("model", ""), source, "model")
        options = data.get("options", {}) or {}
        if not isinstance(options, dict):
            raise FormatError(source, "options", "must be a JSON object")
        scheduling = v.string(data.get("scheduling", "fifo"), source, "scheduling")
        if scheduling not in SCHEDULING:
            raise FormatError(source, "scheduling", f"must be one of {', '.join(SCHEDULING)}, got {scheduling!r}")
        overlap = data.get("overlap_forward", False)
        if not isinstance(overlap, bool):
            raise FormatError(source, "overlap_forward", "must be true or false")
        credit = data.get("credit_bytes")
        if credit is not None:
            credit = v.integer(credit, source, "credit_bytes", minimum=1, maximum=v.MAX_BYTES)
        ops = []
        for j, raw in enumerate(v.array(v.require(data, "operations", source, ""), source, "operations")):
            where = f"operations[{j}]"
            if isinstance(raw, dict):
                v.check_fields(raw, OPERATION_FIELDS, source, where)
            collective = v.string(raw.get("collective", DENSE) if isinstance(raw, dict) else None, source, f"{where}.collective")
            if collective not in OP_COLLECTIVES:
                raise FormatError(source, f"{where}.collective",
                                  f"unknown collective {collective!r}; known: {', '.join(OP_COLLECTIVES)}")
            priority = v.integer(raw.get("priority", j), source, f"{where}.priority", minimum=-(2**62))
            density = raw.get("density")
            if collective == SPARSE:
                if density is None:
                    raise FormatError(source, f"{where}.density", "missing field (required for topk-allgather)")
                density = v.number(density, source, f"{where}.density", positive=True)
                if density > 1:
                    raise FormatError(source, f"{where}.density", f"must be at most 1, got {density}")
            elif density is not None:
                raise FormatError(source, f"{where}.density", f"only {SPARSE} operations have a density; this one is "
                                                              f"{collective}: remove the field")
            gate = raw.get("gate")
            if gate is not None:
                if collective != ALL_GATHER:
                    raise FormatError(source, f"{where}.gate", f"only {ALL_GATHER} operations are gated; this one is "
                                                               f"{collective}: remove the field")
                gate = v.integer(gate, source, f"{where}.gate")
            slices = []
            for k, s in enumerate(v.array(v.require(raw, "slices", source, where), source, f"{where}.slices")):
                if not isinstance(s, list) or len(s) != 3:
                    raise FormatError(source, f"{where}.slices[{k}]", "must be [tensor_index, start_element, end_element]")
                slices.append(Slice(*(v.integer(x, source, f"{where}.slices[{k}]") for x in s)))
            if not slices:
                raise FormatError(source, f"{where}.slices", "an operation needs at least one slice")
            ops.append(Operation(tuple(slices), collective, priority, density, gate))
        # A stated "hash" is informative only: the hash is always recomputed from the
        # content, so a hand-edited plan is checked by its content, never by a stale hash.
        return cls(strategy, tuple(ops), fp, model, options, scheduling, overlap, credit)

    @classmethod
    def load(cls, path: str | Path, profile: Profile | None = None) -> "Plan":
        """Load a plan; with ``profile``, also check that it fits that profile."""
        plan = cls.from_dict(v.read_json(path), str(path))
        if profile is not None:
            plan.check(profile, str(path))
        return plan

    def save(self, path: str | Path) -> None:
        v.write_json(path, self.to_dict())


def gate_tensor(op: Operation) -> int:
    """The tensor whose layer's forward waits for all-gather ``op``: its ``gate``, else its first tensor
    in forward order (tensor indices are in forward order)."""
    return op.gate if op.gate is not None else min(s.tensor for s in op.slices)


def _check_pairs(ops: tuple[Operation, ...], source: str) -> None:
    """Every reduce-scatter has exactly one later all-gather of the same slices and every all-gather
    one earlier reduce-scatter."""
    open_rs: dict[tuple[Slice, ...], list[int]] = {}
    for j, op in enumerate(ops):
        if op.collective == REDUCE_SCATTER:
            open_rs.setdefault(op.slices, []).append(j)
        elif op.collective == ALL_GATHER:
            if not open_rs.get(op.slices):
                raise FormatError(source, f"operations[{j}]", "all-gather without its reduce-scatter: no earlier "
                                  "reduce-scatter has exactly these slices; add one before it, or make the "
                                  "operation an allreduce")
            open_rs[op.slices].pop(0)
    for left in open_rs.values():
        if left:
            raise FormatError(source, f"operations[{left[0]}]", "reduce-scatter without its all-gather: each rank "
                              "would keep only its shard of the summed gradients; add an all-gather of the same "
                              "slices after it")


def _check_gate(j: int, op: Operation, profile: Profile, source: str) -> None:
    """The gate names a tensor of this profile whose layer runs its forward no later than the first
    layer the all-gather holds."""
    n = profile.num_tensors
    gate = gate_tensor(op)
    if not 0 <= gate < n:
        raise FormatError(source, f"operations[{j}].gate", f"gates on tensor {gate}, which this profile does not "
                          f"have (0..{n - 1}): there is no such layer to gate; name a tensor of the layer whose "
                          "forward waits, or leave gate out (the group's first layer)")
    forward_pos = {profile.layer_of[ts[0]]: k for k, ts in enumerate(profile.layer_table.forward)}
    first = min(s.tensor for s in op.slices)
    if forward_pos[profile.layer_of[gate]] > forward_pos[profile.layer_of[first]]:
        raise FormatError(source, f"operations[{j}].gate", f"gates on tensor {gate} ({profile.tensors[gate].name}), "
                          f"whose layer runs its forward after that of tensor {first} "
                          f"({profile.tensors[first].name}), which the all-gather holds: that forward would use "
                          "un-gathered gradients; gate on that tensor or an earlier one")


def whole_tensor_ops(groups: Iterable[Iterable[int]], profile: Profile, *, collective: str = DENSE,
                     density: float | None = None, whole: list[Slice] | None = None) -> tuple[Operation, ...]:
    """One operation per group of whole tensors, priorities in list order.  ``whole``: each tensor's
    whole :class:`Slice` (:func:`whole_slices`), made once where one profile gets many plans."""
    if whole is None:
        return tuple(Operation(tuple(Slice(t, 0, profile.tensors[t].numel) for t in g), collective, j, density)
                     for j, g in enumerate(groups))
    return tuple(Operation(tuple([whole[t] for t in g]), collective, j, density) for j, g in enumerate(groups))


def whole_slices(profile: Profile) -> list[Slice]:
    """Each tensor of ``profile`` as one :class:`Slice`, by tensor index."""
    return [Slice(t, 0, x.numel) for t, x in enumerate(profile.tensors)]


# the slots' own setters (a frozen dataclass' __setattr__ refuses; the slot descriptors do not)
_SET_TENSOR, _SET_START, _SET_END = (vars(Slice)[name].__set__ for name in ("tensor", "start", "end"))


def new_slice(tensor: int, start: int, end: int) -> Slice:
    """``Slice(tensor, start, end)``, equal to it, made without the frozen dataclass's ``__init__``
    (as :func:`block_operations`): a planner that cuts thousands of multi-tensor blocks."""
    s = object.__new__(Slice)
    _SET_TENSOR(s, tensor)
    _SET_START(s, start)
    _SET_END(s, end)
    return s


def new_operation(slices: tuple[Slice, ...], collective: str, priority: int) -> Operation:
    """``Operation(slices, collective, priority)``, equal to it, made as :func:`block_operations` makes
    its operations (no ``density``, no ``gate``)."""
    op = object.__new__(Operation)
    d = op.__dict__
    d["slices"], d["collective"], d["priority"], d["density"], d["gate"] = slices, collective, priority, None, None
    return op


def block_operations(blocks: Iterable[tuple[int, int, int, str, int]]) -> list[Operation]:
    """``Operation((Slice(tensor, start, end),), collective, priority)`` for each ``(tensor, start, end,
    collective, priority)``: equal to those made one by one (tests/test_formats_smoke.py), made
    without the frozen dataclasses' ``__init__`` (an ``object.__setattr__`` per field), in about a
    third of the time: a planner that cuts thousands of blocks (``usbyte``)."""
    new = object.__new__
    out = []
    for tensor, start, end, collective, priority in blocks:
        s = new(Slice)
        _SET_TENSOR(s, tensor)
        _SET_START(s, start)
        _SET_END(s, end)
        op = new(Operation)
        d = op.__dict__
        d["slices"], d["collective"], d["priority"], d["density"], d["gate"] = (s,), collective, priority, None, None
        out.append(op)
    return out
