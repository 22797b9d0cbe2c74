"""Per-tensor profiler: measure (or, on the meta device, estimate) a model's Profile.

Planners need, per parameter tensor, its size, the forward and backward time of the
layer that owns it, and the order in which gradients become ready.  This module gets
them from hooks on a few training iterations of any ``nn.Module``::

    profile = profile_module(model, (inputs, targets), loss_fn=F.cross_entropy, iterations=10)

How time is attributed (one iteration; a *clock* is the wall clock, synchronised
with the device on CUDA, or on ``meta`` a FLOP count at a given rate):

- *Layers* are the modules that directly own trainable parameters (``nn.Linear``,
  ``nn.Conv2d``, ``nn.LayerNorm``, an ``nn.MultiheadAttention``'s own projection...).
  Each tensor belongs to the layer of the first such module, in call order, that owns
  it, so a tied weight (GPT-2's ``lm_head.weight is wte.weight``) belongs to the
  embedding, and the head's forward time is added to the embedding's layer too: that
  layer cannot run its later use before its parameters are updated either.
- *Forward*: a pre-hook on every layer module stamps the clock; the time from one
  stamp to the next belongs to the layer whose stamp opened the interval.  So a layer
  is charged with itself and the parameterless work after it (activation, pooling,
  attention arithmetic) up to the next layer, and the whole forward pass is shared
  out; a module called twice is charged both intervals.  The time before the first
  layer and the loss go to ``other_s``.
- *Backward*: ``Tensor.register_post_accumulate_grad_hook`` stamps each gradient as it
  is accumulated; that firing order is the profile's ``ready_order``.  Layers are
  taken in the order their first gradient appears; a layer's backward time is its last
  gradient's stamp minus the previous layer's (the first layer counts from the start
  of ``backward()``).  So ``Profile.ready_s`` reproduces the measured stamps.
- ``update_s``: the optimizer step (median, timed in the plain iterations below),
  shared over tensors in proportion to their size: a plan that overlaps the update
  with the next forward runs each layer's share just before that layer.
- ``other_s``: the median whole iteration (forward, loss, backward, optimizer step),
  timed in iterations without stamps interleaved with the stamped ones, minus the
  attributed sum and the update; on ``meta``, zero.  Those plain iterations also give the
  ``iteration_s`` and ``forward_backward_s`` fields that the attribution is checked
  against.

Every time is a median over ``iterations`` iterations after ``warmup`` (per layer,
then scaled so that the layers sum to the median iteration's total).  Frozen
parameters (``requires_grad=False``) have no gradient to communicate and are left
out; a trainable parameter that never receives a gradient (an unused module) is kept
with zero times, placed last in the ready order, and listed under ``unused``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from gradsched.errors import GradschedError
from gradsched.profile import Profile, TensorProfile

Batch = Any  # (inputs, targets) with a loss_fn; the inputs alone without one
Clock = Callable[[], float]


@dataclass
class _Iteration:
    """Clock stamps of one hooked iteration."""

    fwd_start: float = 0.0
    fwd_marks: list[tuple[int, float]] = field(default_factory=list)  # (module index, stamp) at pre-hooks
    fwd_end: float = 0.0
    bwd_start: float = 0.0
    bwd_end: float = 0.0
    opt_end: float = 0.0  # after optimizer.step() (== bwd_end without an optimizer)
    step_end: float = 0.0
    ready: list[tuple[int, float]] = field(default_factory=list)  # (tensor index, stamp) at grad hooks


@dataclass
class _Layout:
    """The model's trainable tensors in forward order, grouped into layers."""

    names: list[str]
    params: list[nn.Parameter]
    layer_of_tensor: list[int]  # layer index (forward order) of each tensor
    layer_of_module: list[int | None]  # layer index charged with each hooked module's time
    unused: list[int]  # tensors whose owners never ran
    from_hook: dict[int, int]  # hook's tensor index (position in the hooked list) -> forward-order index


def profile_module(module: nn.Module, batch: Batch | Callable[[], Batch], *,
                   loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                   iterations: int = 10, warmup: int = 2, device: str | torch.device | None = None,
                   device_tflops: float | None = None, optimizer: torch.optim.Optimizer | None = None,
                   model_name: str | None = None, progress: bool = False, plain_reference: bool = True) -> Profile:
    """Profile one model's training iteration and return its :class:`Profile`.

    ``batch`` is an example batch or a callable returning one per iteration: with a
    ``loss_fn``, an ``(inputs, targets)`` pair and the loss is ``loss_fn(module(inputs),
    targets)``; without, the inputs alone and the loss is the output's own ``loss`` (a
    Hugging Face model given ``labels`` in a dict batch) or else the output's sum.  Inputs
    that are a tuple/list are passed as positional arguments, a dict as keywords.

    ``device``: where to run (default: where the module's parameters are).  The module
    and batch are moved there, and the module is put in training mode.  On ``"meta"`` nothing is allocated or computed: times
    are FLOPs counted by PyTorch divided by ``device_tflops`` (required), one
    iteration suffices and ``other_s`` is 0.  ``optimizer``: stepped once per
    iteration so its cost lands in ``other_s`` (default: SGD with learning rate 0,
    which costs a real update but leaves the weights unchanged).  ``plain_reference=False``: the hooked
    iterations are their own whole-iteration reference, none runs without hooks (a replayed model, whose clock
    does not count the hooks' host work: ``gradsched bench`` on a dilated replay, where each costs a step)."""
    # long function: a third of it is the docstring of a public entry point; the rest is one timed loop
    if iterations < 1:
        raise GradschedError(f"iterations must be at least 1, got {iterations}")
    if warmup < 0:
        raise GradschedError(f"warmup must be at least 0, got {warmup}")
    dev = _resolve_device(module, device)
    meta = dev.type == "meta"
    if meta and device_tflops is None:
        raise GradschedError("profiling on the meta device estimates times from FLOPs and needs the device's "
                             "rate: pass device_tflops (--device-tflops), e.g. 300 for an H100 at bf16")
    module.to(dev)
    module.train()
    get_batch = batch if callable(batch) else (lambda: batch)
    step = _Step(module, get_batch, loss_fn, dev)

    clock_cm: Any
    if meta:
        from gradsched.torch.measure.flops import FlopClock
        clock_cm = FlopClock(device_tflops)  # type: ignore[arg-type]
        clock: Clock = clock_cm
        iterations, warmup = 1, 0  # FLOP counts are exact: one pass tells all
    else:
        clock_cm = nullcontext()
        clock = _wall_clock(dev)

    params = [p for p in _unique_params(module) if p.requires_grad]
    if not params:
        raise GradschedError("the module has no trainable parameters (requires_grad=True): nothing to profile")
    if optimizer is None and not meta:
        optimizer = torch.optim.SGD(params, lr=0.0)

    named = [(n, m) for n, m in module.named_modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    hooked = [m for _, m in named]
    unhooked: list[_Iteration] = []
    runs: list[_Iteration] = []
    # Each timed hooked iteration is followed by one without stamps (nor, on CUDA, their
    # synchronisation): the whole-iteration reference, taken under the same conditions.
    n_plain = 0 if meta or not plain_reference else iterations
    bar = _progress_bar(warmup + iterations + n_plain, model_name or type(module).__name__, progress)
    try:
        with clock_cm, _Hooks(hooked, params, clock) as hooks:
            for i in range(warmup + iterations):
                it = hooks.start()
                step.run(it, clock, optimizer)
                bar.update(1)
                if i < warmup:
                    continue
                runs.append(it)
                if n_plain:
                    hooks.pause()
                    unhooked.append(_Iteration())
                    step.run(unhooked[-1], clock, optimizer)
                    bar.update(1)
    finally:
        bar.close()

    layout = _layout(module, [n for n, _ in named], hooked, params, runs[0])
    reference = unhooked if plain_reference or meta else runs
    return _build_profile(layout, runs, reference, model_name or type(module).__name__,
                          extra={"device": str(dev), "iterations": iterations, "warmup": warmup,
                                 "method": "flops" if meta else "hooks",
                                 **({"device_tflops": device_tflops} if meta else {})})


# ------------------------------------------------------------------------ running
class _Step:
    """One training iteration, stamping the clock where the profile needs it."""

    def __init__(self, module: nn.Module, get_batch: Callable[[], Batch], loss_fn: Any, dev: torch.device) -> None:
        self.module, self.get_batch, self.loss_fn, self.dev = module, get_batch, loss_fn, dev

    def run(self, it: _Iteration, clock: Clock, optimizer: torch.optim.Optimizer | None) -> None:
        batch = _to(self.get_batch(), self.dev)
        if self.loss_fn is None:
            inputs, targets = batch, None
        else:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise GradschedError("with a loss_fn the batch must be an (inputs, targets) pair, "
                                     f"got {type(batch).__name__}")
            inputs, targets = batch
        it.fwd_start = clock()
        out = _call(self.module, inputs)
        it.fwd_end = clock()
        loss = model_loss(out) if self.loss_fn is None else self.loss_fn(out, targets)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise GradschedError("the loss must be a single-element tensor; check loss_fn")
        it.bwd_start = clock()
        loss.backward()
        it.bwd_end = clock()
        if optimizer is not None:
            optimizer.step()
            it.opt_end = clock()
            optimizer.zero_grad(set_to_none=True)
        else:
            it.opt_end = it.bwd_end
            self.module.zero_grad(set_to_none=True)
        it.step_end = clock()


class _Hooks:
    """Forward pre-hooks on layer modules and post-accumulate-grad hooks on parameters."""

    def __init__(self, modules: list[nn.Module], params: list[nn.Parameter], clock: Clock) -> None:
        self.modules, self.params, self.clock = modules, params, clock
        self.current = _Iteration()
        self.active = True
        self._stack = ExitStack()

    def start(self) -> _Iteration:
        self.current = _Iteration()
        self.active = True
        return self.current

    def pause(self) -> None:
        """Let the next iteration run without stamps (the hooks stay, but return at once)."""
        self.active = False

    def _mark(self, mi: int) -> None:
        if self.active:
            self.current.fwd_marks.append((mi, self.clock()))

    def _ready(self, ti: int) -> None:
        if self.active:
            self.current.ready.append((ti, self.clock()))

    def __enter__(self) -> "_Hooks":
        for mi, m in enumerate(self.modules):
            h = m.register_forward_pre_hook(lambda _m, _a, mi=mi: self._mark(mi))
            self._stack.callback(h.remove)
        for ti, p in enumerate(self.params):
            h = p.register_post_accumulate_grad_hook(lambda _p, ti=ti: self._ready(ti))
            self._stack.callback(h.remove)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()


# ------------------------------------------------------------------------ attribution
def _layout(module: nn.Module, module_names: list[str], hooked: list[nn.Module], params: list[nn.Parameter],
            first: _Iteration) -> _Layout:
    """Order tensors by first use and group them into layers (see the module docstring)."""
    names = {id(p): n for n, p in module.named_parameters()}
    trainable = {id(p) for p in params}
    call_order = _module_order(module_names, [mi for mi, _ in first.fwd_marks])
    got_grad = {ti for ti, _ in first.ready}
    ordered: list[nn.Parameter] = []
    tensor_layer: list[int] = []
    owner_layer: dict[int, int] = {}  # id(param) -> layer
    module_layer: list[int | None] = [None] * len(hooked)
    n_layers = 0
    for mi in call_order:
        own = [p for p in hooked[mi].parameters(recurse=False) if id(p) in trainable and id(p) not in owner_layer]
        if own:
            layer = n_layers
            n_layers += 1
            for p in own:
                owner_layer[id(p)] = layer
                ordered.append(p)
                tensor_layer.append(layer)
            module_layer[mi] = layer
        else:  # every parameter already owned by an earlier module: charge that layer
            shared = [p for p in hooked[mi].parameters(recurse=False) if id(p) in owner_layer]
            module_layer[mi] = owner_layer[id(shared[0])] if shared else None
    position = {id(p): i for i, p in enumerate(ordered)}
    from_hook = {ti: position[id(p)] for ti, p in enumerate(params)}
    unused = sorted(from_hook[ti] for ti in range(len(params)) if ti not in got_grad)
    return _Layout([names[id(p)] for p in ordered], ordered, tensor_layer, module_layer, unused, from_hook)


def _module_order(module_names: list[str], calls: list[int]) -> list[int]:
    """Layer modules in first-call order; a module never called directly (``nn.MultiheadAttention``
    reads its ``out_proj`` parameters without calling it) goes right after its nearest
    called ancestor, so its tensors keep their place in forward order; the rest go last."""
    called: list[int] = []
    for mi in calls:
        if mi not in called:
            called.append(mi)
    placed = set(called)
    order: list[int] = []
    for mi in called:
        order.append(mi)
        prefix = module_names[mi] + "." if module_names[mi] else ""
        for mj, name in enumerate(module_names):
            if mj not in placed and name.startswith(prefix):
                placed.add(mj)
                order.append(mj)
    return order + [mj for mj in range(len(module_names)) if mj not in placed]


def _forward_by_layer(layout: _Layout, it: _Iteration, n_layers: int) -> tuple[list[float], float]:
    """Per-layer forward seconds of one iteration, and the unattributed rest."""
    out = [0.0] * n_layers
    marks = it.fwd_marks
    rest = (marks[0][1] if marks else it.fwd_end) - it.fwd_start
    for k, (mi, t) in enumerate(marks):
        end = marks[k + 1][1] if k + 1 < len(marks) else it.fwd_end
        layer = layout.layer_of_module[mi]
        if layer is None:
            rest += end - t
        else:
            out[layer] += end - t
    return out, rest


def _backward_by_layer(layout: _Layout, it: _Iteration, index_of: dict[int, int],
                       n_layers: int) -> tuple[list[float], list[int]]:
    """Per-layer backward seconds of one iteration and its ready order (tensor indices)."""
    order = [index_of[ti] for ti, _ in it.ready]
    stamp = {index_of[ti]: t for ti, t in it.ready}
    done: dict[int, float] = {}
    layer_seq: list[int] = []
    for i in order:
        lay = layout.layer_of_tensor[i]
        if lay not in done:
            layer_seq.append(lay)
        done[lay] = max(done.get(lay, stamp[i]), stamp[i])
    out = [0.0] * n_layers
    clock = it.bwd_start
    for lay in layer_seq:
        end = max(done[lay], clock)
        out[lay] = end - clock
        clock = end
    missing = [i for i in range(len(layout.params)) if i not in stamp]
    return out, order + missing


def _build_profile(layout: _Layout, runs: list[_Iteration], unhooked: list[_Iteration], model: str,
                   extra: dict[str, Any]) -> Profile:
    n_layers = max(layout.layer_of_tensor) + 1
    index_of = layout.from_hook
    fwd_runs, bwd_runs, rests, orders = [], [], [], []
    for it in runs:
        f, rest = _forward_by_layer(layout, it, n_layers)
        b, order = _backward_by_layer(layout, it, index_of, n_layers)
        fwd_runs.append(f)
        bwd_runs.append(b)
        rests.append(rest)
        orders.append(tuple(order))
    fwd = _robust_split(fwd_runs, n_layers)
    bwd = _robust_split(bwd_runs, n_layers)
    ready_order, count = Counter(orders).most_common(1)[0]
    tensors = []
    first_of_layer: set[int] = set()
    for i, (name, p) in enumerate(zip(layout.names, layout.params)):
        lay = layout.layer_of_tensor[i]
        carries = lay not in first_of_layer
        first_of_layer.add(lay)
        tensors.append(TensorProfile(name, p.numel(), p.numel() * p.element_size(),
                                     fwd[lay] if carries else 0.0, bwd[lay] if carries else 0.0, layer=lay))
    attributed = sum(fwd) + sum(bwd)
    extra = dict(extra)
    update = 0.0
    if unhooked:  # measured without hooks: the reference the attribution is checked against
        iteration_s = statistics.median(it.step_end - it.fwd_start for it in unhooked)
        extra["iteration_s"] = iteration_s
        extra["forward_backward_s"] = statistics.median(it.bwd_end - it.fwd_start for it in unhooked)
        update = statistics.median(it.opt_end - it.bwd_end for it in unhooked)
        other = max(0.0, iteration_s - attributed - update)
        total_numel = sum(t.numel for t in tensors)
        tensors = [replace(t, update_s=update * t.numel / total_numel) for t in tensors]
    else:
        other = 0.0
    extra["unattributed_forward_s"] = statistics.median(rests)
    if count < len(orders):
        extra["ready_order_agreement"] = f"{count}/{len(orders)} iterations"
    if layout.unused:
        extra["unused"] = [layout.names[i] for i in layout.unused]
    return Profile(model, tuple(tensors), tuple(ready_order), other, extra)


def _robust_split(runs: list[list[float]], n_layers: int) -> list[float]:
    """Per-layer medians, scaled so that they sum to the median per-iteration total.

    A stall (another process taking the core) lands on one layer of most iterations:
    each layer's median ignores it, so the medians' sum would fall short of a typical
    iteration.  Medians give the shares, the median total gives the sum."""
    medians = [statistics.median(r[k] for r in runs) for k in range(n_layers)]
    total = statistics.median(sum(r) for r in runs)
    summed = sum(medians)
    return [m * total / summed for m in medians] if summed > 0 else medians


# ------------------------------------------------------------------------ helpers
def _unique_params(module: nn.Module) -> list[nn.Parameter]:
    return [p for _, p in module.named_parameters()]


def _resolve_device(module: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is None:
        first = next(module.parameters(), None)
        return first.device if first is not None else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise GradschedError(f"unknown device {device!r}; use cpu, cuda, cuda:N or meta") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GradschedError("device cuda requested but PyTorch sees no CUDA device; use --device cpu or meta")
    return dev


def _wall_clock(dev: torch.device) -> Clock:
    if dev.type == "cuda":
        def clock() -> float:
            torch.cuda.synchronize(dev)  # hooks run on the host: wait for the kernels they stamp
            return time.perf_counter()
        return clock
    return time.perf_counter


def _to(x: Any, dev: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, dev) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    return x


def _call(module: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return module(*inputs)
    return module(inputs)


def model_loss(out: Any) -> torch.Tensor:
    """The loss of a model's output without a ``loss_fn``: a Hugging Face output's own ``loss`` (the batch
    carried ``labels``), else the sum of the outputs."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return _sum_output(out)


def _sum_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, (tuple, list)):
        return sum(_sum_output(o) for o in out)  # type: ignore[return-value]
    if isinstance(out, dict):
        return sum(_sum_output(o) for o in out.values())  # type: ignore[return-value]
    raise GradschedError(f"cannot make a loss from a {type(out).__name__} output: pass loss_fn")


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, name: str, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=f"profiling {name}", unit="it", file=sys.stderr, leave=False)
