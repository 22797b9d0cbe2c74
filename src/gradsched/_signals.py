"""SIGTERM handled like Ctrl-C by a command that holds something to clean up.

Why: Python's default SIGTERM ends the process at once, skipping every ``finally`` and
``with`` exit, so a ``gradsched bench`` sent SIGTERM (by a job scheduler, ``timeout``,
``kill``) left its temporary ``gradsched-bench-*`` folder behind (issue 39).  Inside
:func:`sigterm_unwinds` SIGTERM raises instead, the stack unwinds (workers stopped,
folders removed), and the signal is then delivered again under the handler that was
there before, so the exit status still says "terminated"."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException: ``except Exception`` does not swallow it)."""


def _raise(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def sigterm_unwinds(what: str = "gradsched") -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated`; after unwinding, ``what`` (the command) says so in
    one line and the signal is re-delivered."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    except Terminated:
        print(f"{what}: terminated (SIGTERM); its workers were stopped", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)  # under the previous handler: by default, the process ends here
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
