"""What the user sees of the workers a command launched: their progress while they run, and the
failing rank's own error when they fail (not the launcher's ``ChildFailedError`` summary).

Torch-free: the workers (:mod:`gradsched.torch.jobs.worker`) write a failing rank's error
as JSON (:data:`gradsched.jobs.config.ERROR_FILE`) and rank 0 prints progress lines
(:data:`gradsched.jobs.config.PROGRESS_PREFIX`); this module reads both."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from gradsched.jobs.config import ERROR_FILE, PROGRESS_PREFIX

WORKER_LOG_PREFIX = "gradsched[rank"  # a worker's log line (--log-level), gradsched.torch.jobs.worker


def printer(*, progress: bool, worker_log: bool) -> Callable[[str], bool]:
    """What :func:`gradsched.jobs.launch.launch` does with each line the workers print: progress lines
    (and, with ``worker_log``, the workers' log lines) on stderr as they come; returns whether the line
    belongs in the tail kept for a failure report (not a progress line)."""
    def on_line(line: str) -> bool:
        if line.startswith(PROGRESS_PREFIX):
            if progress:
                print(line.removeprefix(PROGRESS_PREFIX), file=sys.stderr, flush=True)
            return False
        if worker_log and line.startswith(WORKER_LOG_PREFIX):
            print(line, file=sys.stderr, flush=True)
        return True

    return on_line


def first_failure(out_dir: str | Path) -> dict | None:
    """The error of the rank that failed first (the others often fail because it left), or None when no
    rank wrote one (a crash below Python, a kill)."""
    records = []
    for path in Path(out_dir).glob(ERROR_FILE.format(rank="*")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(records, key=lambda r: (r.get("time", 0.0), r.get("rank", 0))) if records else None


def failure_report(out_dir: str | Path, code: int, output: list[str]) -> tuple[list[str], str]:
    """(lines to print on stderr, the summary that follows "... failed ") for workers that exited with ``code``.

    With a rank's own error: its traceback's last lines and ``on rank R: Type: message``;
    without: the last lines of the launcher's output and its last line naming an error."""
    failure = first_failure(out_dir)
    if failure is not None:
        message = (str(failure.get("message", "")).strip().splitlines() or [""])[0]
        tail = [ln for ln in failure.get("tail", []) if ln.strip(" ^~")]  # not the carets under a line
        detail = [f"rank {failure.get('rank')} failed; the last lines of its traceback:", *("  " + ln for ln in tail)]
        return detail, f"on rank {failure.get('rank')}: {failure.get('type')}: {message}"
    lines = [ln for ln in output if ln.strip()]
    errors = [ln.strip() for ln in lines if "Error" in ln and "Traceback" not in ln
              and "ChildFailedError" not in ln]
    return lines[-25:], (f"(workers exited with {code}): {errors[-1]}" if errors else
                         f"(workers exited with {code}; no worker reported an error: the launcher's output is above)")
