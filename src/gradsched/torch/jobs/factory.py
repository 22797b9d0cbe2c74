"""Your own model in the command line: ``--model package.module:factory`` (docs/profiling.md).

``gradsched profile``, ``train`` and ``bench`` accept, besides the built-in names, a
model factory given as ``MODULE:FUNCTION``.  The function is called as
``factory(seed)`` (or ``factory()`` if it takes no argument), after
``torch.manual_seed(seed)``, and returns::

    (module, batch_fn)            or    (module, batch_fn, loss_fn)

- ``module``: the ``torch.nn.Module`` to train (on the CPU; the runtime moves it);
- ``batch_fn(batch_size: int, generator: torch.Generator) -> (inputs, targets)``:
  one batch, drawn from ``generator`` so that every rank gets its own reproducible data;
- ``loss_fn(outputs, targets) -> scalar tensor`` (optional): by default cross-entropy
  when the targets are integer class indices, else mean squared error.

Every rank calls the factory with the same seed, so a factory that draws its
parameters from PyTorch's default generator builds the same model everywhere.  The
module must be importable from the current directory or ``PYTHONPATH``.  Each way
this can go wrong (module not importable, no such function, a wrong return) is a
one-line :class:`GradschedError` that says what is missing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from gradsched.errors import GradschedError

SIGNATURE = "factory(seed) -> (module, batch_fn) or (module, batch_fn, loss_fn)"


def is_factory(name: str) -> bool:
    """True when ``name`` names a factory (``MODULE:FUNCTION``) rather than a built-in model."""
    return ":" in name


def load_factory(spec: str) -> Callable[..., Any]:
    """The function ``spec`` (``MODULE:FUNCTION``) names, imported; errors say what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise GradschedError(f"--model {spec!r}: a model factory is given as MODULE:FUNCTION, "
                             f"e.g. mymodels:build")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # `python -m` has it; the `gradsched` script does not
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise GradschedError(f"--model {spec}: cannot import module {module_name!r} ({exc}); it must be importable "
                             f"from the current directory or PYTHONPATH") from None
    except Exception as exc:  # the user's module failed while importing: say where
        raise GradschedError(f"--model {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise GradschedError(f"--model {spec}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    _check_factory(spec, fn)
    return fn


def _check_factory(spec: str, fn: Any) -> None:
    """Before anything is called: ``fn`` is a function written in Python, not in the standard library,
    that takes ``(seed)`` or ``()``.  A built-in such as ``os:system`` or ``shutil:rmtree`` is never called
    (``os:system`` ran ``os.system(0)``: issue 39)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not inspect.isfunction(target):
        what = "a built-in function" if inspect.isbuiltin(target) else f"a {type(target).__name__}"
        raise GradschedError(f"--model {spec}: {spec.partition(':')[2]!r} is {what}, not a function written in "
                             f"Python (gradsched calls no other); expected {SIGNATURE}")
    top = (target.__module__ or "").partition(".")[0]
    if top in sys.stdlib_module_names:
        raise GradschedError(f"--model {spec}: {target.__module__}.{target.__qualname__} is part of Python's standard "
                             f"library, not a model factory; expected {SIGNATURE}")
    try:
        inspect.signature(fn).bind(0)
    except TypeError:
        try:
            inspect.signature(fn).bind()
        except TypeError:
            raise GradschedError(f"--model {spec}: the factory takes {inspect.signature(fn)}; it must take (seed) or "
                                 f"nothing: {SIGNATURE}") from None


def build_from_factory(spec: str, seed: int = 0) -> tuple[nn.Module, Callable[..., Any], Callable[..., Any]]:
    """Call the factory ``spec`` names and check what it returns: ``(module, make_batch, loss_fn)``.

    (:func:`gradsched.torch.jobs.models.build_model` wraps them in a ``ModelSpec``.)"""
    fn = load_factory(spec)
    torch.manual_seed(seed)
    args = _factory_args(spec, fn, seed)
    out = _call_user(spec, "the factory", fn, args)
    if not (isinstance(out, tuple) and len(out) in (2, 3)):
        raise GradschedError(f"--model {spec}: the factory returned {_kind(out)}; expected {SIGNATURE}")
    module, batch_fn = out[0], out[1]
    loss_fn = out[2] if len(out) == 3 else default_loss
    if not isinstance(module, nn.Module):
        raise GradschedError(f"--model {spec}: the factory's first value is {_kind(module)}, not a torch.nn.Module")
    if not callable(batch_fn):
        raise GradschedError(f"--model {spec}: the factory's second value is {_kind(batch_fn)}, not a batch function "
                             "batch_fn(batch_size, generator) -> (inputs, targets)")
    if not callable(loss_fn):
        raise GradschedError(f"--model {spec}: the factory's third value is {_kind(loss_fn)}, not a loss function "
                             "loss_fn(outputs, targets) -> tensor")
    if not any(p.requires_grad for p in module.parameters()):
        raise GradschedError(f"--model {spec}: the module has no trainable parameters: nothing to communicate")
    return module, _checked_batches(spec, batch_fn), loss_fn


def default_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer class targets, mean squared error otherwise."""
    if not targets.is_floating_point():
        return F.cross_entropy(outputs, targets)
    return F.mse_loss(outputs, targets)


def _checked_batches(spec: str, batch_fn: Callable[..., Any]) -> Callable[[int, torch.Generator], tuple[Any, Any]]:
    if not _accepts(batch_fn, 2):
        raise GradschedError(f"--model {spec}: the batch function takes {_arity(batch_fn)}; expected "
                             "batch_fn(batch_size, generator) -> (inputs, targets)")

    def make(batch_size: int, generator: torch.Generator) -> tuple[Any, Any]:
        batch = _call_user(spec, "the batch function", batch_fn, (batch_size, generator))
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise GradschedError(f"--model {spec}: the batch function returned {_kind(batch)}; expected "
                                 "(inputs, targets)")
        return batch[0], batch[1]

    return make


def _factory_args(spec: str, fn: Callable[..., Any], seed: int) -> tuple[Any, ...]:
    """``(seed,)`` or ``()``, as the factory's signature takes it; another signature is the user's error."""
    if _accepts(fn, 1):
        return (seed,)
    if _accepts(fn, 0):
        return ()
    raise GradschedError(f"--model {spec}: the factory takes {_arity(fn)}; expected {SIGNATURE} "
                         "(the seed argument may be left out)")


def _accepts(fn: Callable[..., Any], n: int) -> bool:
    """True when ``fn`` can be called with ``n`` positional arguments (or its signature cannot be read)."""
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: let the call tell
        return True
    return True


def _arity(fn: Callable[..., Any]) -> str:
    try:
        return f"arguments {inspect.signature(fn)}"
    except (TypeError, ValueError):
        return "other arguments"


def _call_user(spec: str, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)``; an exception the user's code raises is a one-line user error naming where it was raised."""
    try:
        return fn(*args)
    except GradschedError:
        raise
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if len(tb) > 1 else ""
        first = (str(exc).strip().splitlines() or [""])[0]
        raise GradschedError(f"--model {spec}: {what} raised {type(exc).__name__}{where}: {first}") from None


def _kind(x: Any) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    return "None" if x is None else f"a {type(x).__name__}"
