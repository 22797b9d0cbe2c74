"""Profile: what one model's gradients cost to compute (``gradsched.profile/1``).

A profile lists the model's parameter tensors in forward order with their sizes and
the forward/backward time of the layer that owns each, plus the order in which the
gradients become ready during backward.  Planners and the simulator read nothing
else about the model, so a profile measured on a GPU, estimated on the meta device
or converted from a paper's logs are all interchangeable.

Layers: where a layer owns several tensors (weight and bias), the first tensor in
forward order carries the layer's time and the others carry 0.  A tensor may name
its layer explicitly with the optional ``layer`` field; otherwise a tensor whose
forward and backward times are both 0 belongs to the layer of the tensor before it.
All tensors of a layer become ready together, when that layer's backward ends.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from gradsched import _validate as v
from gradsched.errors import FormatError, GradschedError

FORMAT = "gradsched.profile/1"
OP_HOST_FIELDS = ("issue_s", "retire_s")  # docs/simulator.md, "What it models", 7
TENSOR_FIELDS = ("name", "numel", "bytes", "forward_s", "backward_s", "layer", "update_s")
FIELDS = ("format", "model", "tensors", "ready_order", "other_s")
# Optional fields gradsched's own tools write (kept verbatim; docs/formats.md): known, so
# that a misspelling of one is caught (_validate.check_fields).
OPTIONAL_FIELDS = ("op_host", "batch_size", "source", "device", "iterations", "warmup", "method", "device_tflops",
                   "iteration_s", "forward_backward_s", "unattributed_forward_s", "ready_order_agreement", "unused")


@dataclass(frozen=True, slots=True)
class OpHost:
    """Host time a runtime spends per operation on the training thread (the profile's
    optional ``op_host``; docs/simulator.md, "What it models", 7).  Left out: 0."""

    issue_s: float = 0.0  # to issue an operation, right after the layer that completes it
    retire_s: float = 0.0  # to retire it once it is done
    # one deferred update of an overlapping plan in the next forward (one torch.optim step() over the
    # parameters whose operations completed), beyond the parameters' own update_s
    update_call_s: float = 0.0

    def __post_init__(self) -> None:
        for name in (*OP_HOST_FIELDS, "update_call_s"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise GradschedError(f"host time per operation {name} must be a finite non-negative number of "
                                     f"seconds, got {x!r}; fix the profile's op_host")

    def to_dict(self) -> dict[str, float]:
        """``update_call_s`` only where set (files written before it had the field read the same)."""
        out = {name: getattr(self, name) for name in OP_HOST_FIELDS}
        if self.update_call_s:
            out["update_call_s"] = self.update_call_s
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>", where: str = "op_host") -> "OpHost":
        """From the JSON object (every field optional), checked field by field."""
        return cls(**v.numbers(data, source, where, (*OP_HOST_FIELDS, "update_call_s")))


@dataclass(frozen=True, slots=True)
class TensorProfile:
    """One parameter tensor: its size and its owning layer's compute times."""

    name: str
    numel: int
    bytes: int
    forward_s: float
    backward_s: float
    layer: int | None = None  # explicit layer id; None: inferred (see module docstring)
    update_s: float = 0.0  # optimizer update time of this tensor (optional)

    @property
    def element_bytes(self) -> int:
        return self.bytes // self.numel


@dataclass(frozen=True)
class LayerTable:
    """A profile's layers, derived once per profile (:attr:`Profile.layer_table`): what the
    simulator walks on every simulation, and the planners that group whole layers."""

    ready: tuple[tuple[int, ...], ...]  # each layer's tensors (ready order), layers in the order their backward ends
    position: dict[int, int]  # layer id -> its index in ``ready``
    backward_s: tuple[float, ...]  # each layer's backward time, in ``ready``'s order
    forward: tuple[tuple[int, ...], ...]  # each layer's tensors (index order), layers in forward order
    forward_s: tuple[float, ...]  # in ``forward``'s order
    update_s: tuple[float, ...]  # in ``forward``'s order


@dataclass(frozen=True)
class Profile:
    """A model's tensors in forward order, their ready order and per-iteration extras."""

    model: str
    tensors: tuple[TensorProfile, ...]
    ready_order: tuple[int, ...] | None = None
    other_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # optional fields kept verbatim
    op_host: OpHost | None = None  # None: the runtime's host time per operation is not charged

    def __post_init__(self) -> None:
        if "op_host" in self.extra:  # passed as an extra before it had a field: lands in the field
            raw = self.extra["op_host"]
            object.__setattr__(self, "op_host", raw if isinstance(raw, OpHost) else OpHost.from_dict(raw))
            object.__setattr__(self, "extra", {k: x for k, x in self.extra.items() if k != "op_host"})
        _check(self, "<profile>")

    # ----------------------------------------------------------------- derived
    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @cached_property
    def order(self) -> tuple[int, ...]:
        """Tensor indices in the order their gradients become ready (backward order)."""
        if self.ready_order is not None:
            return self.ready_order
        return tuple(range(len(self.tensors) - 1, -1, -1))

    @cached_property
    def layer_of(self) -> tuple[int, ...]:
        """Layer id of every tensor (explicit or inferred)."""
        layers: list[int] = []
        next_id = 0
        for i, t in enumerate(self.tensors):
            if t.layer is not None:
                layers.append(t.layer)
            elif i > 0 and t.forward_s == 0 and t.backward_s == 0 and self.tensors[i - 1].layer is None:
                layers.append(layers[-1])
            else:
                layers.append(-1 - next_id)  # inferred ids are negative: never clash with explicit ones
                next_id += 1
        return tuple(layers)

    @cached_property
    def ready_s(self) -> tuple[float, ...]:
        """Seconds after backward starts at which each tensor's gradient is ready.

        Walks the ready order; the first tensor of a layer met there runs the whole
        layer's backward (the sum of its tensors' ``backward_s``)."""
        layer_time: dict[int, float] = {}
        for t, lid in zip(self.tensors, self.layer_of):
            layer_time[lid] = layer_time.get(lid, 0.0) + t.backward_s
        done: dict[int, float] = {}
        clock = 0.0
        ready = [0.0] * len(self.tensors)
        for i in self.order:
            lid = self.layer_of[i]
            if lid not in done:
                clock += layer_time[lid]
                done[lid] = clock
            ready[i] = done[lid]
        return tuple(ready)

    @cached_property
    def layer_table(self) -> LayerTable:
        """The layers in ready order and in forward order, with their times (sums in tensor order)."""
        ready: dict[int, list[int]] = {}
        for i in self.order:
            ready.setdefault(self.layer_of[i], []).append(i)
        position = {lid: k for k, lid in enumerate(ready)}
        backward = [0.0] * len(ready)
        forward: dict[int, list[int]] = {}
        for i, (t, lid) in enumerate(zip(self.tensors, self.layer_of)):
            backward[position[lid]] += t.backward_s
            forward.setdefault(lid, []).append(i)
        tensors = self.tensors
        return LayerTable(tuple(map(tuple, ready.values())), position, tuple(backward),
                          tuple(map(tuple, forward.values())),
                          tuple(sum(tensors[i].forward_s for i in ts) for ts in forward.values()),
                          tuple(sum(tensors[i].update_s for i in ts) for ts in forward.values()))

    @cached_property
    def forward_s(self) -> float:
        return sum(t.forward_s for t in self.tensors)

    @cached_property
    def backward_s(self) -> float:
        return sum(t.backward_s for t in self.tensors)

    @cached_property
    def update_s(self) -> float:
        return sum(t.update_s for t in self.tensors)

    @property
    def compute_s(self) -> float:
        """Forward + backward + update + other: the iteration time with free communication."""
        return self.forward_s + self.backward_s + self.update_s + self.other_s

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def total_numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @cached_property
    def fingerprint(self) -> str:
        """Hash of the model's structure (names, sizes, order): what a plan depends on.

        Times are left out on purpose: re-profiling the same model keeps its plans valid."""
        key = [[t.name, t.numel, t.bytes] for t in self.tensors]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        tensors = []
        for t in self.tensors:
            d: dict[str, Any] = {"name": t.name, "numel": t.numel, "bytes": t.bytes,
                                 "forward_s": t.forward_s, "backward_s": t.backward_s}
            if t.layer is not None:
                d["layer"] = t.layer
            if t.update_s:
                d["update_s"] = t.update_s
            tensors.append(d)
        out: dict[str, Any] = {"format": FORMAT, "model": self.model, "tensors": tensors}
        if self.ready_order is not None:
            out["ready_order"] = list(self.ready_order)
        if self.other_s:
            out["other_s"] = self.other_s
        out.update(self.extra)
        if self.op_host is not None:
            out["op_host"] = self.op_host.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Profile":
        v.check_format(data, FORMAT, source)
        model = v.string(v.require(data, "model", source, ""), source, "model")
        raw = v.array(v.require(data, "tensors", source, ""), source, "tensors")
        if not raw:
            raise FormatError(source, "tensors", "must list at least one tensor")
        tensors = []
        for i, t in enumerate(raw):
            where = f"tensors[{i}]"
            name = v.string(v.require(t, "name", source, where), source, f"{where}.name")
            v.check_fields(t, TENSOR_FIELDS, source, where)
            numel = v.integer(v.require(t, "numel", source, where), source, f"{where}.numel", minimum=1,
                              maximum=v.MAX_BYTES)
            nbytes = v.integer(v.require(t, "bytes", source, where), source, f"{where}.bytes", minimum=1,
                               maximum=v.MAX_BYTES)
            if nbytes % numel:
                raise FormatError(source, f"{where}.bytes",
                                  f"{nbytes} is not a whole number of bytes per element for numel {numel}")
            fwd = v.number(v.require(t, "forward_s", source, where), source, f"{where}.forward_s", maximum=v.MAX_SECONDS)
            bwd = v.number(v.require(t, "backward_s", source, where), source, f"{where}.backward_s",
                           maximum=v.MAX_SECONDS)
            layer = t.get("layer")
            if layer is not None:
                layer = v.integer(layer, source, f"{where}.layer")
            upd = v.number(t.get("update_s", 0.0), source, f"{where}.update_s", maximum=v.MAX_SECONDS)
            tensors.append(TensorProfile(name, numel, nbytes, fwd, bwd, layer, upd))
        ready = data.get("ready_order")
        if ready is not None:
            ready = tuple(v.integer(x, source, f"ready_order[{j}]") for j, x in enumerate(v.array(ready, source, "ready_order")))
        other = v.number(data.get("other_s", 0.0), source, "other_s", maximum=v.MAX_SECONDS)
        op_host = OpHost.from_dict(data["op_host"], source) if "op_host" in data else None
        v.check_fields(data, FIELDS + OPTIONAL_FIELDS, source, "")
        extra = {k: val for k, val in data.items() if k not in FIELDS and k != "op_host"}
        profile = cls.__new__(cls)
        object.__setattr__(profile, "model", model)
        object.__setattr__(profile, "tensors", tuple(tensors))
        object.__setattr__(profile, "ready_order", ready)
        object.__setattr__(profile, "other_s", other)
        object.__setattr__(profile, "extra", extra)
        object.__setattr__(profile, "op_host", op_host)
        _check(profile, source)
        return profile

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return cls.from_dict(v.read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        v.write_json(path, self.to_dict())

    def with_times(self, scale: float) -> "Profile":
        """A copy with every compute time multiplied by ``scale`` (e.g. a faster device)."""
        return Profile(self.model, tuple(TensorProfile(t.name, t.numel, t.bytes, t.forward_s * scale,
                                                       t.backward_s * scale, t.layer, t.update_s * scale)
                                         for t in self.tensors),
                       self.ready_order, self.other_s * scale, dict(self.extra), self.op_host)

    def op_host_s(self) -> tuple[float, float]:
        """``(issue_s, retire_s)``: host time the runtime spends per operation on the training thread.

        From the optional ``op_host`` field (``gradsched bench`` measures it on gradsched's
        runtime: :mod:`gradsched.torch.runtime.hosttime`): issuing an operation right after the
        layer that completes it, and retiring it once it is done.  None: nothing charged."""
        host = self.op_host or OpHost()
        return host.issue_s, host.retire_s

    def op_update_call_s(self) -> float:
        """Host time of one deferred update of an overlapping plan (``op_host.update_call_s``; 0 without)."""
        return self.op_host.update_call_s if self.op_host is not None else 0.0

    def with_op_host(self, issue_s: float, retire_s: float, update_call_s: float = 0.0) -> "Profile":
        """A copy whose runtime spends ``issue_s`` and ``retire_s`` of host time per operation, and
        ``update_call_s`` per deferred update of an overlapping plan."""
        return replace(self, op_host=OpHost(issue_s, retire_s, update_call_s))

    def with_bucket_costs(self, backward_s_per_byte: float = 0.0, update_s_per_byte: float = 0.0) -> "Profile":
        """A copy where each tensor's backward and update take longer by its bytes times a rate.

        For what a data-parallel runtime does to every gradient on the compute stream
        besides computing it: a gradient-ready hook copies it into its bucket and scales
        it by 1/world (``backward_s_per_byte``: it delays the rest of backward), and a
        runtime whose gradients are not views of the buckets copies the averaged result
        back before the optimizer step (``update_s_per_byte``).  A model profiled on its
        own pays neither; on a CPU they are a pass over memory per byte (vgg on this
        project's 2-core machine: about 10 ms of a 300 ms step, docs/bench.md)."""
        if backward_s_per_byte < 0 or update_s_per_byte < 0:
            raise ValueError("bucket costs per byte cannot be negative")
        layer_bytes: dict[int, int] = {}
        first: dict[int, int] = {}  # a layer's time sits on its first tensor (module docstring): so does the cost
        for i, (t, lid) in enumerate(zip(self.tensors, self.layer_of)):
            layer_bytes[lid] = layer_bytes.get(lid, 0) + t.bytes
            first.setdefault(lid, i)
        tensors = list(self.tensors)
        for lid, i in first.items():
            t = tensors[i]
            tensors[i] = TensorProfile(t.name, t.numel, t.bytes, t.forward_s,
                                       t.backward_s + layer_bytes[lid] * backward_s_per_byte, t.layer,
                                       t.update_s + layer_bytes[lid] * update_s_per_byte)
        return Profile(self.model, tuple(tensors),
                       self.ready_order, self.other_s, dict(self.extra), self.op_host)


def _check(profile: Profile, source: str) -> None:
    """Cross-field rules that typed construction alone cannot express."""
    n = len(profile.tensors)
    if n == 0:
        raise FormatError(source, "tensors", "must list at least one tensor")
    for i, t in enumerate(profile.tensors):
        if t.numel <= 0:
            raise FormatError(source, f"tensors[{i}].numel", "must be positive")
        if t.bytes <= 0:
            raise FormatError(source, f"tensors[{i}].bytes", "must be positive")
        for name in ("forward_s", "backward_s", "update_s"):
            v.number(getattr(t, name), source, f"tensors[{i}].{name}", maximum=v.MAX_SECONDS)
    v.number(profile.other_s, source, "other_s", maximum=v.MAX_SECONDS)
    seen: dict[str, int] = {}
    for i, t in enumerate(profile.tensors):
        if t.name in seen:
            raise FormatError(source, f"tensors[{i}].name", f"{t.name!r} is also tensors[{seen[t.name]}]'s name; "
                                                             "every tensor needs its own (plans name tensors by it)")
        seen[t.name] = i
    if profile.total_bytes > v.MAX_BYTES:
        raise FormatError(source, "tensors", f"hold {profile.total_bytes:.3g} bytes in all, above the largest "
                                             f"gradsched takes ({v.MAX_BYTES:.3g})")
    if profile.ready_order is not None:
        if sorted(profile.ready_order) != list(range(n)):
            raise FormatError(source, "ready_order", f"must be a permutation of 0..{n - 1}")
