"""Modules the wrapper cannot train correctly, refused before any collective with what to do instead.

- **Parameters on the ``meta`` device** (a model built under ``torch.device("meta")``
  or loaded lazily) have shapes but no data: wrapping them "trained" nothing, every
  step a no-op that looked like success.
- **A parameter with no elements** has nothing to reduce; the planners' profiles hold
  tensors of at least one element, and the error used to name a profile field the
  user never wrote.
- **A module wrapped twice**: both wrappers' autograd hooks fire on every gradient, so a
  step through the second one averaged some gradients twice and was 2.6-7.8% off
  PyTorch's (issue 39).  The parameters of every live wrapper are remembered (weakly:
  a wrapper that is gone frees them; an executor keeps its wrapper alive while its hooks
  are registered, a dropped wrapper's included), and a second wrapper over any of them
  is refused while the first one's hooks are on them (closing its executor releases them).

Every rank builds the same module, so every rank refuses alike, before the start-up check.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from gradsched.errors import GradschedError

# parameter -> weak reference to the gradsched wrapper that holds it
_OWNERS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def check_module(module: nn.Module) -> None:
    """Refuse a module on ``meta``, with an empty trainable parameter, or wrapped already (module docstring)."""
    check_unwrapped(module)
    meta = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if meta:
        raise GradschedError(f"{len(meta)} parameter(s)/buffer(s) of the module are on the meta device "
                             f"({_names(meta)}): they have shapes but no values, so nothing would train; materialise them before "
                             "wrapping (module.to_empty(device=...) and initialise or load the weights)")
    empty = [n for n, p in module.named_parameters() if p.requires_grad and p.numel() == 0]
    if empty:
        raise GradschedError(f"parameter(s) {_names(empty)} have no elements: there is nothing to synchronise in "
                             "them; freeze them (requires_grad_(False)) or remove them before wrapping")


def check_unwrapped(module: nn.Module) -> None:
    """Refuse ``module`` if a live gradsched wrapper holds one of its parameters (one that was dropped
    but is still alive lives on in its executor's hooks, which would still reduce every gradient)."""
    if any(_owner(p) is not None for p in module.parameters()):
        gc.collect()  # a dropped wrapper whose hooks are gone may only wait for the collector
    for name, p in module.named_parameters():
        if _owner(p) is not None:
            raise GradschedError(f"parameter {name!r} is already held by another gradsched DistributedDataParallel "
                                 "(this module, or a module sharing its parameters, was wrapped before): both "
                                 "wrappers would reduce its gradients, and steps would be wrong; wrap the module "
                                 "once and train through that wrapper")


def claim(module: nn.Module, wrapper: Any) -> None:
    """Record ``wrapper`` (fully built: a failed construction claims nothing) as the owner of ``module``'s
    parameters."""
    ref = weakref.ref(wrapper)
    for p in module.parameters():
        _OWNERS[p] = ref


def _owner(p: nn.Parameter) -> Any:
    """The live wrapper whose hooks are on ``p`` (one whose executor was closed holds nothing), or None."""
    ref = _OWNERS.get(p)
    owner = ref() if ref is not None else None
    return owner if owner is not None and owner.hooks_parameters() else None


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
