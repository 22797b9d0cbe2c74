"""``torch.distributed.run``, stopped quietly: the launcher that every gradsched job starts per host (or node).

``gradsched bench``, ``train`` and ``netbench`` stop a job's launchers with SIGTERM (a rank's failure, the
timeout, Ctrl-C or SIGTERM to the command: :mod:`gradsched.jobs.launch`).  torch's elastic agent then stops
its workers and raises ``SignalException``, which every launcher printed as a traceback, with a warning that
it got a death signal and one per worker it closed: on 2 hosts, two tracebacks and four more lines under the
command's own.  Here the agent stops its workers as before and exits with 128 + the signal's number, saying
nothing: the command's line is the one the user reads.  Anything else (a worker's failure, its report)
passes through unchanged.

    python -m gradsched.torch.jobs.agent [torch.distributed.run's arguments]
"""

from __future__ import annotations

import logging
import sys

QUIET = ("death signal", "closing signal")  # the agent's warnings while it stops its workers on a signal


class _Stopping(logging.Filter):
    """Drops the elastic agent's warnings about stopping on a signal (:data:`QUIET`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(q in str(record.msg) for q in QUIET)


def main(argv: list[str] | None = None) -> int:
    """Run ``torch.distributed.run`` with ``argv`` (default: this process's arguments); its exit status, or
    128 + the signal's number where a signal stopped it."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_Stopping())
    try:
        run.main(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except SystemExit as exc:  # torchrun's own exit (an argument error, a failed worker's status)
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
