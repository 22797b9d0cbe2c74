"""Errors raised on bad user input.

Every error that a user can cause by handing gradsched a bad file or flag is a
:class:`GradschedError`: the command line prints its one-line message and exits 2,
without a traceback.  Formats raise :class:`FormatError`, which names the file, the
field and the reason, so the user knows what to fix.
"""

from __future__ import annotations


class GradschedError(Exception):
    """A problem with the user's input or setup, reported as one line."""


class FormatError(GradschedError, ValueError):
    """A JSON file or object that does not follow its gradsched format."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        self.field = field
        self.reason = reason
        super().__init__(f"{source}: {field}: {reason}")
