"""Errors: what a user can fix, and faults of gradsched itself.

Every error that a user can cause by handing gradsched a bad file or flag is a
:class:`GradschedError`: the command line prints its one-line message and exits 2,
without a traceback.  Formats raise :class:`FormatError`, which names the file, the
field and the reason, so the user knows what to fix.  A state that no input should
reach is an :class:`InternalError` (or any other exception): the command line prints
the traceback and asks for a bug report, and exits 1.
"""

from __future__ import annotations


class GradschedError(Exception):
    """A problem with the user's input or setup, reported as one line."""


class InternalError(RuntimeError):
    """A fault in gradsched itself, not in the user's input (reported with its traceback)."""


class FormatError(GradschedError, ValueError):
    """A JSON file or object that does not follow its gradsched format."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        self.field = field
        self.reason = reason
        super().__init__(f"{source}: {field}: {reason}")


class WorkersFailed(GradschedError):
    """Launched worker processes failed: the command exits with their status, not 2.

    Exit status 2 means "fix your input"; a training or benchmark whose workers failed
    (a crash, a timeout, a plan that does not fit the model) exits with the status the
    launcher reported (``torch.distributed.run`` exits 1 when a worker fails)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status if exit_status not in (0, 2) else 1
