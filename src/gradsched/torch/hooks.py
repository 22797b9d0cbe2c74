"""A kept old path of :mod:`gradsched.integrations.hooks` (``from gradsched.torch.hooks import topk_hook``)."""

from gradsched.integrations.hooks import *  # noqa: F401,F403 - re-exported: the names in its __all__

__all__ = [name for name in dir() if not name.startswith("_")]  # the names of its __all__, brought above
