"""Leaving a worker process without tripping over interpreter finalisation.

After ``destroy_process_group()``, gloo's worker threads can still hold finished
``AsyncWork`` objects that reference tensors; if the interpreter is torn down
while they are destroyed, the process may abort ("terminate called without an
active exception", SIGABRT) although all its work finished and was written.  A
worker that has flushed its results therefore ends with ``os._exit``, skipping the
finalisation race (the same reason PyTorch's launcher reports such aborts only
as a failure of the process, not of the job's results).
"""

from __future__ import annotations

import os
import sys


def leave(code: int = 0) -> None:
    """Flush stdio and end the process now with ``code`` (use only in worker entry points)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
