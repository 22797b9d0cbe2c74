"""Top-k sparsified communication with error feedback: the ``topk-allgather`` operation kind.

Per operation and step (OMGS-SGD's and GRACE's top-k with residual memory):

1. compensate: ``c = gradient + residual`` (what was not sent before is not lost);
2. select the ``k = ceil(density * numel)`` largest ``|c|`` (:func:`gradsched.sparsity.k_of`, the same ``k`` on every
   rank, so the all-gather is regular), exactly (``torch.topk``) or through a sampled
   threshold (DGC style: a threshold from a strided sample keeps a few candidates,
   ``torch.topk`` runs on those; it falls back to the exact selection when the
   sample underestimates, so both methods pick the same elements);
3. the residual keeps what was not sent: ``c`` with the sent entries set to zero, so
   ``sent + residual == c`` exactly (without error feedback it is cleared);
4. values (divided by the world size, as DDP averages) and int32 indices are
   all-gathered; every rank scatter-adds them into a dense result, in rank order.

With density 1 every element is sent and the residual stays zero: the result is
the dense average.  The first ``warmup_steps`` steps send the dense gradient with
an all-reduce instead (a common remedy for early-training instability).

Memory (LaySA, Zhao et al. 2021): the naive design keeps the gradient buffer, a
residual, and value/index buffers alive all the time (twice the model or more).
In the ``laysa`` mode (default) the residual *is* the operation's piece of the flat
buffer: each gradient is added into it when autograd delivers it (the gradient is
then released), selection runs in place, value/index buffers exist only while the
operation is in flight, and the dense result is rebuilt one chunk of whole tensors
at a time (never larger than the largest tensor); each chunk updates its weights
at once (the "mirror" update, through :class:`~gradsched.torch.runtime.optim.DistributedOptimizer`)
and is freed (:class:`LaysaDelivery`, which the executor holds).  ``naive`` keeps the
classic layout, for comparison.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gradsched.errors import GradschedError
from gradsched.options import Option, check_all
from gradsched.plan import SPARSE, Operation
from gradsched.sparsity import k_of
from gradsched.torch.runtime.groups import uses_nccl
from gradsched.torch.runtime.inflight import applied
from gradsched.torch.runtime.layout import Layout, Piece
from gradsched.torch.runtime.memory import MemoryLedger
from gradsched.torch.runtime.ops import OP_KINDS, wait_all
from gradsched.torch.runtime.trace import UPDATE, Tracer

INDEX_DTYPE = torch.int32  # indices on the wire: 4 bytes, as the cost model assumes
SELECTIONS = ("exact", "sampled")
MEMORY_MODES = ("laysa", "naive")
SAMPLE_NUMEL = 4096  # elements in the sampled-threshold estimate
SAMPLE_MARGIN = 2.0  # keep about this many times k candidates
SELECT_CHUNK = 1 << 20  # elements per selection pass (4 MB of magnitudes + 16 MB of topk work space on CPU)
DEFAULT_CHECK_EVERY = 1000  # sparse steps between cross-rank parameter checks


@dataclass(frozen=True, kw_only=True, slots=True)
class SparseOptions:
    """How ``topk-allgather`` operations run (the plan says which tensors and the density)."""

    warmup_steps: int = 0
    """Steps at the start that send the dense gradient (all-reduce) instead of the top-k."""
    selection: str = "exact"
    """``exact`` (``torch.topk``) or ``sampled`` (DGC-style threshold, exact fallback)."""
    error_feedback: bool = True
    """Keep what was not sent and add it to the next step's gradient (turn off only to see why it matters)."""
    memory: str = "laysa"
    """``laysa``: residual in place, buffers only while needed, per-chunk mirror update; ``naive``: all persistent."""
    check_every: int = DEFAULT_CHECK_EVERY
    """Every this many steps, check that every rank holds the same parameters (0: never); a mismatch raises."""

    @classmethod
    def of(cls, value: "SparseOptions | dict[str, Any] | None") -> "SparseOptions":
        """Options from ``None``, a dict (e.g. from JSON) or an instance, each checked as :data:`OPTIONS`
        declares it, with one-line errors that say what is allowed."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            value = value.to_dict()
        elif not isinstance(value, dict):
            raise GradschedError(f"sparse_options must be a dict or SparseOptions, got {type(value).__name__}")
        return cls(**check_all("sparse option", OPTIONS, value, what="sparse option"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


OPTIONS = (
    Option("warmup_steps", int, 0, low=0, doc="steps at the start that send the dense gradient"),
    Option("selection", str, "exact", choices=SELECTIONS, doc="exact (torch.topk) or sampled (DGC-style)"),
    Option("error_feedback", bool, True, doc="keep what was not sent for the next step"),
    Option("memory", str, "laysa", choices=MEMORY_MODES, doc="laysa (residual in place) or naive"),
    Option("check_every", int, DEFAULT_CHECK_EVERY, low=0, doc="steps between cross-rank parameter checks (0: never)"),
)
""":class:`SparseOptions`' fields as :class:`~gradsched.options.Option` declarations (their checks)."""


def topk_indices(x: torch.Tensor, k: int, method: str = "exact", chunk: int = SELECT_CHUNK) -> torch.Tensor:
    """Indices (int64) of ``k`` largest-magnitude entries of the flat tensor ``x``.

    Works through ``x`` in pieces of ``max(chunk, k)`` elements, so its temporaries
    (magnitudes, ``torch.topk``'s work space of 16 bytes per element on CPU) are
    bounded by the piece, not by ``x``: over a whole 8.4M-element buffer they were
    about 170 MB that no ledger saw (docs/sparse.md)."""
    n = x.numel()
    if k >= n:
        return torch.arange(n, device=x.device)
    step = max(chunk, k)
    if method == "sampled" and n > 4 * SAMPLE_NUMEL and k * SAMPLE_MARGIN * 4 < n:
        stride = n // SAMPLE_NUMEL
        sample = x[::stride].abs()
        ks = min(sample.numel(), max(1, math.ceil(SAMPLE_MARGIN * k * sample.numel() / n)))
        threshold = torch.topk(sample, ks, sorted=False).values.min()
        candidates = torch.cat([torch.nonzero(x[lo:lo + step].abs() >= threshold).view(-1) + lo
                                for lo in range(0, n, step)])
        if candidates.numel() >= k:  # every top-k element is a candidate: the exact answer, cheaper
            top = torch.topk(x[candidates].abs(), k, sorted=False).indices
            return candidates[top]
    best_v: torch.Tensor | None = None
    best_i: torch.Tensor | None = None
    for lo in range(0, n, step):  # the global top k are each among their piece's top k
        mag = x[lo:lo + step].abs()
        v, i = torch.topk(mag, min(k, mag.numel()), sorted=False)
        del mag
        i += lo
        if best_v is not None and best_i is not None:
            v, i = torch.cat([best_v, v]), torch.cat([best_i, i])
            if v.numel() > k:
                v, top = torch.topk(v, k, sorted=False)
                i = i[top]
        best_v, best_i = v, i
    assert best_i is not None  # n > k >= 1: at least one piece
    return best_i


def compress(c: torch.Tensor, k: int, method: str = "exact", error_feedback: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Select from the compensated gradient ``c`` in place: returns ``(indices, values)``.

    Afterwards ``c`` is the residual: ``c`` with the sent entries zeroed (so sent plus
    residual equals the compensated gradient exactly), or all zeros without error feedback."""
    idx = topk_indices(c, k, method)
    values = c.index_select(0, idx)
    if error_feedback:
        c.index_fill_(0, idx, 0)
    else:
        c.zero_()
    return idx, values


def scatter_ranks(out: torch.Tensor, gi: torch.Tensor, gv: torch.Tensor, world_size: int, lo: int = 0,
                  *, every: bool = False) -> None:
    """``out[i - lo] += v`` for every gathered ``(i, v)`` with ``lo <= i < lo + len(out)`` (``every``:
    all indices are known to fall there, nothing is filtered): one
    ``index_add_`` per rank, in rank order.

    Each rank's indices are distinct (a top-k), so no call adds twice into one element:
    CUDA's ``index_add_`` (atomic adds, in no fixed order where indices repeat) then
    gives the same bits on every rank and every run, and the sum over ranks is taken
    in rank order everywhere.  One call over all ranks' pairs could round colliding
    indices differently on different ranks, and their parameters would drift apart."""
    hi = lo + out.numel()
    for i, v in zip(gi.chunk(world_size), gv.chunk(world_size)):
        if not every:
            mask = (i >= lo) & (i < hi)
            i, v = i[mask] - lo, v[mask]
        out.index_add_(0, i.long(), v)


def parameter_checksum(params: list[torch.Tensor], chunk: int = SELECT_CHUNK) -> torch.Tensor:
    """Two int64 sums over the parameters' bits (plain, and weighted by position): equal bits, equal sums.

    Integer arithmetic, so the sums do not depend on the order a device adds in; a
    changed element changes the plain sum, two swapped ones the weighted one.  Works
    in pieces of ``chunk`` elements (bounded temporaries)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    device = params[0].device if params else torch.device("cpu")
    total = torch.zeros(2, dtype=torch.int64, device=device)
    weights = (torch.arange(chunk, device=device, dtype=torch.int64) % 65521) + 1
    for p in params:
        flat = p.detach().reshape(-1)
        bits = flat.view(ints[flat.element_size()]) if flat.element_size() in ints else flat.view(torch.uint8)
        for lo in range(0, bits.numel(), chunk):
            b = bits[lo:lo + chunk].to(torch.int64)
            total[0] += b.sum()
            total[1] += (b * weights[:b.numel()]).sum()
    return total


def check_replicas(params: list[torch.Tensor], group: dist.ProcessGroup, *, step: int, rank: int,
                   timeout_s: float) -> None:
    """Raise on every rank if the ranks' parameters are not bit-identical (a collective on ``group``)."""
    mine = parameter_checksum(params)
    if dist.get_backend(group) != "nccl":
        mine = mine.cpu()
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(everyone, mine, group=group, async_op=True)
    wait_all([work], host_wait=True, timeout_s=timeout_s, rank=rank, what="parameter check across ranks")
    sums = [tuple(t.tolist()) for t in everyone]
    if len(set(sums)) > 1:
        differ = [r for r, s in enumerate(sums) if s != sums[0]]
        raise GradschedError(f"ranks' parameters differ after {step} steps (ranks {differ} differ from rank 0): "
                             "the replicas drifted apart; an update that is not the same on every rank (a "
                             "rank-dependent change to parameters or gradients after backward) is the usual cause")


class TopkAllGather:
    """One ``topk-allgather`` operation (see the module docstring); the executor's :class:`OpRunner`."""

    def __init__(self, index: int, op: Operation, pieces: tuple[Piece, ...], arenas: dict[str, torch.Tensor],
                 group: dist.ProcessGroup, world_size: int, rank: int,
                 on_complete: Callable[[int], None] | None = None, *, ledger: MemoryLedger,
                 options: SparseOptions, step_of: Callable[[], int], **_context: object) -> None:
        if len(pieces) != 1:
            raise GradschedError(f"operation {index} (topk-allgather) mixes {len(pieces)} element types; a sparse "
                                 "operation must hold tensors of one dtype (split it by dtype)")
        self.index = index
        self.piece = arenas[pieces[0].dtype][pieces[0].start:pieces[0].end]
        self.numel = self.piece.numel()
        self.k = k_of(op.density if op.density is not None else 1.0, self.numel)
        self.nbytes = self.k * (self.piece.element_size() + 4)  # per rank on the wire
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.on_complete = on_complete
        self.ledger = ledger
        self.options = options
        self.step_of = step_of
        self.naive = options.memory == "naive"
        self.host_wait = not uses_nccl(group, self.piece.device)
        self.works: list[dist.Work] = []
        self.warm = False
        self.held: dict[str, torch.Tensor] = {}  # name -> buffer held now (all in the ledger)
        self.keep: list[tuple[int, int]] = []  # piece ranges of tensors no rank used this step (set before issue)
        if self.naive:
            self.residual = self._alloc("residual", torch.zeros_like(self.piece))
            self._alloc_wire()
        else:
            self.residual = self.piece  # compensated gradient and residual live in the flat buffer itself

    # ------------------------------------------------------------------ buffers
    def _alloc(self, what: str, t: torch.Tensor) -> torch.Tensor:
        name = f"op{self.index}/{what}"
        self.held[name] = self.ledger.alloc(name, t)
        return t

    def _free(self, what: str) -> None:
        name = f"op{self.index}/{what}"
        if name in self.held:
            del self.held[name]
            self.ledger.free(name)

    def _alloc_wire(self) -> None:
        dev, p = self.piece.device, self.world_size
        self._alloc("send_values", torch.empty(self.k, dtype=self.piece.dtype, device=dev))
        self._alloc("send_indices", torch.empty(self.k, dtype=INDEX_DTYPE, device=dev))
        self._alloc("gathered_values", torch.empty(p * self.k, dtype=self.piece.dtype, device=dev))
        self._alloc("gathered_indices", torch.empty(p * self.k, dtype=INDEX_DTYPE, device=dev))

    def _free_wire(self) -> None:
        if not self.naive:
            for what in ("send_values", "send_indices", "gathered_values", "gathered_indices"):
                self._free(what)

    def _wire(self, what: str) -> torch.Tensor:
        return self.held[f"op{self.index}/{what}"]

    # ------------------------------------------------------------------ OpRunner protocol
    def issue(self) -> None:
        self.warm = self.step_of() < self.options.warmup_steps
        if self.warm:  # dense all-reduce of the gradient (the residual is untouched)
            self.piece.div_(self.world_size)
            self.works = [dist.all_reduce(self.piece, op=dist.ReduceOp.SUM, group=self.group, async_op=True)]
        else:
            if self.naive:
                self.residual.add_(self.piece)
            else:
                self._alloc_wire()
            idx, values = self._select()
            send_v, send_i = self._wire("send_values"), self._wire("send_indices")
            torch.div(values, self.world_size, out=send_v)
            send_i.copy_(idx)
            gv, gi = self._wire("gathered_values"), self._wire("gathered_indices")
            self.works = [
                dist.all_gather(list(gv.chunk(self.world_size)), send_v, group=self.group, async_op=True),
                dist.all_gather(list(gi.chunk(self.world_size)), send_i, group=self.group, async_op=True)]
        if self.on_complete is not None:
            self.works[-1].get_future().add_done_callback(lambda _f: self.on_complete(self.index))

    def _select(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`compress` the residual, holding back the ranges in :attr:`keep` (tensors no rank used).

        A held-back range is taken out of the selection and put back unchanged, so its
        residual waits for a step that uses the tensor: sending it now would lose it,
        as no rank applies a result to an unused tensor.  (Should fewer than ``k``
        elements remain, zeros of the held-back ranges are sent, which change nothing.)"""
        if not self.keep or not self.options.error_feedback:
            return compress(self.residual, self.k, self.options.selection, self.options.error_feedback)
        name = f"op{self.index}/held-back"
        saved = self.ledger.alloc(name, torch.cat([self.residual[lo:hi] for lo, hi in self.keep]))
        for lo, hi in self.keep:
            self.residual[lo:hi].zero_()
        idx, values = compress(self.residual, self.k, self.options.selection, True)
        at = 0
        for lo, hi in self.keep:
            self.residual[lo:hi].copy_(saved[at:at + hi - lo])
            at += hi - lo
        del saved
        self.ledger.free(name)
        return idx, values

    def is_done(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self, timeout_s: float) -> None:
        wait_all(self.works, host_wait=self.host_wait, timeout_s=timeout_s, rank=self.rank,
                 what=f"top-k all-gather of operation {self.index} ({self.nbytes} bytes per rank)")
        self.works = []
        if self.naive and not self.warm:  # classic design: the dense result goes into the gradient buffer
            self.piece.zero_()
            scatter_ranks(self.piece, self._wire("gathered_indices"), self._wire("gathered_values"),
                          self.world_size, every=True)

    # ------------------------------------------------------------------ LaySA results
    def results(self, chunks: list[tuple[int, int]], keep: bool) -> Iterator[tuple[int, int, torch.Tensor, str | None]]:
        """The dense averaged result, one chunk ``[lo, hi)`` of the piece at a time (``laysa`` mode).

        Yields ``(lo, hi, flat, name)``: ``name`` is the ledger entry of a buffer the
        caller now owns and must free (``None`` for a view of the piece).  With
        ``keep`` the caller holds the chunks past the next chunk (no mirror update)."""
        try:
            if self.warm:
                for lo, hi in chunks:
                    if keep:
                        name = f"op{self.index}/result[{lo}:{hi}]"
                        yield lo, hi, self.ledger.alloc(name, self.piece[lo:hi].clone()), name
                    else:
                        yield lo, hi, self.piece[lo:hi], None
                self.piece.zero_()  # the residual stays empty during warm-up
                return
            gi, gv = self._wire("gathered_indices"), self._wire("gathered_values")
            for lo, hi in chunks:
                name = f"op{self.index}/result[{lo}:{hi}]"
                flat = self.ledger.alloc(name, torch.zeros(hi - lo, dtype=gv.dtype, device=gv.device))
                self.ledger.transient(self.k * (8 + 1 + gv.element_size()))  # one rank's mask, indices, values
                scatter_ranks(flat, gi, gv, self.world_size, lo, every=lo == 0 and hi == self.numel)
                yield lo, hi, flat, name
        finally:
            self._free_wire()

    def residual_tensor(self) -> torch.Tensor:
        return self.residual


class LaysaDelivery:
    """LaySA's delivery of top-k results: rebuilt one chunk of whole tensors at a time, each chunk
    applied to its weights through ``mirror`` and freed.

    Held by the executor (:mod:`gradsched.torch.runtime.executor`) of a plan with
    ``topk-allgather`` operations in the ``laysa`` memory mode; it calls :meth:`deliver`
    once a sparse operation is done, and :meth:`release_kept` when a backward starts."""

    def __init__(self, params: list[nn.Parameter], names: list[str], layout: Layout, ledger: MemoryLedger,
                 tracer: Tracer | None) -> None:
        self.params = params
        self.names = names
        self.layout = layout
        self.ledger = ledger
        self.tracer = tracer
        self.chunk_numel = max(p.numel() for p in params)  # a result chunk never exceeds the largest tensor
        self.kept: dict[str, torch.Tensor] = {}  # results left as .grad (no mirror update): freed next backward

    def release_kept(self) -> None:
        """Free last step's results left as ``.grad`` (the optimizer has used them by now)."""
        for name in self.kept:
            self.ledger.free(name)
        self.kept.clear()

    def chunks(self, j: int) -> list[list[tuple[int, int, int]]]:
        """Operation ``j``'s tensors in chunks of ``(tensor, lo, hi)`` (piece coordinates), in piece order,
        a new chunk whenever the next tensor would take it past :attr:`chunk_numel`."""
        base = self.layout.op_pieces[j][0].start
        slots = sorted(self.layout.op_slots[j], key=lambda s: s.arena_start)
        groups: list[list[tuple[int, int, int]]] = []
        size = 0
        for s in slots:
            lo, hi = s.arena_start - base, s.arena_start - base + s.end - s.start
            if not groups or size + hi - lo > self.chunk_numel:
                groups.append([])
                size = 0
            groups[-1].append((s.tensor, lo, hi))
            size += hi - lo
        return groups

    def deliver(self, j: int, runner: TopkAllGather, mirror: Callable[[list[nn.Parameter]], None] | None,
                written: list[bool], unused: set[int]) -> None:
        """Rebuild operation ``j``'s result (``runner``'s) chunk by chunk; update each chunk's weights and free it.

        Marks its tensors in ``written``; tensors in ``unused`` (no rank computed them) keep
        their ``.grad``, like DDP.  Without ``mirror`` the results stay as ``.grad`` (kept)."""
        groups = self.chunks(j)
        chunks = [(g[0][1], g[-1][2]) for g in groups]
        keep = mirror is None
        for c, (lo, _hi, flat, name) in enumerate(runner.results(chunks, keep)):  # run to exhaustion
            g = groups[c]
            params = []
            for t, a, b in g:
                written[t] = True
                if t in unused:
                    continue  # no rank computed it: .grad stays as it was, like DDP
                p = self.params[t]
                p.grad = flat[a - lo:b - lo].view_as(p)
                params.append(p)
            if mirror is None:
                if name is not None:
                    self.kept[name] = flat
                continue
            if params:
                t0 = self.tracer.now() if self.tracer is not None else 0.0
                mirror(params)
                if self.tracer is not None:
                    self.tracer.span(f"update {self.names[g[0][0]]}", UPDATE, t0, tensors=[t for t, _, _ in g])
            for p in params:
                p.grad = applied(p)  # updated from the aggregated result: not kept, and any use is an error
            if name is not None:
                self.ledger.free(name)


def benchmark_selection(device: str | torch.device = "cpu", method: str = "exact", *, density: float = 0.001,
                        sizes: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000, 10_000_000),
                        repeats: int = 3) -> tuple[float, list[tuple[int, float]]]:
    """Fit ``c`` in ``ts(n) = c * n * log2(n)`` for ``method`` on ``device`` (OMGS-SGD's model).

    Returns ``(c, [(n, median seconds), ...])``; store ``c`` in a cluster file as
    ``topk_selection_s_per_nlogn`` (``Cluster.selection_s`` reads it).  The fit is
    least squares weighted towards large ``n`` (relative error), where selection matters."""
    if method not in SELECTIONS:
        raise GradschedError(f"selection method must be one of {', '.join(SELECTIONS)}, got {method!r}")
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    points: list[tuple[int, float]] = []
    for n in sizes:
        x = torch.randn(int(n), generator=gen).to(dev)
        k = k_of(density, int(n))
        topk_indices(x, k, method)  # warm-up
        times = []
        for _ in range(repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            topk_indices(x, k, method)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        points.append((int(n), statistics.median(times)))
    # minimise sum((c f - t)^2 / t^2): relative error, so 1e3 and 1e7 both count
    num = sum(f * t / t ** 2 for n, t in points if (f := n * math.log2(n)) > 0 and t > 0)
    den = sum(f * f / t ** 2 for n, t in points if (f := n * math.log2(n)) > 0 and t > 0)
    return (num / den if den > 0 else 0.0), points


OP_KINDS[SPARSE] = TopkAllGather
