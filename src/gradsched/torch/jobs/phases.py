"""Where a bench's time and memory go: one record per phase of the job.

``gradsched bench`` prints a line per phase (profiling, network table, probe, rows,
run-time auto's warm-up where it ran, rounds) and puts the records into its JSON, so that start-up can be told from the
rounds, and the phase that sets a rank's peak memory is known."""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

from gradsched.jobs.results import Phase
from gradsched.procfs import proc_bytes


def vm_hwm_bytes() -> int:
    """This process's peak resident memory (``VmHWM`` of /proc/self/status; 0 where there is none)."""
    return proc_bytes("/proc/self/status", "VmHWM") or 0


def rss_file_bytes() -> int:
    """This process's resident pages of mapped files (``RssFile``: the shared libraries, torch's ~80-110 MB;
    0 where there is none).  Part of ``VmHWM``, shared between the ranks and reclaimable, and not the same
    for identical installs: the kernel maps more or fewer of a library's cached pages (torch alone 77 MB in one
    virtual environment, 108 MB in a fresh install of the same packages, anonymous memory within 0.1 MB)."""
    return proc_bytes("/proc/self/status", "RssFile") or 0


class Phases:
    """Seconds (the slowest rank's) and peak RSS (the largest rank's, so far) at the end of each phase.

    A collective: every rank calls :meth:`end` with the same names in the same order."""

    def __init__(self) -> None:
        self.records: list[Phase] = []  # gradsched.jobs.results.Phase: the bench JSON's phases
        self._t0 = time.perf_counter()

    def end(self, name: str) -> None:
        """The phase ``name`` ends now; the next one starts."""
        import torch

        now = time.perf_counter()
        figures = torch.tensor([now - self._t0, float(vm_hwm_bytes()), float(rss_file_bytes())], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        self.records.append({"phase": name, "s": float(figures[0]), "peak_rss_bytes": int(figures[1]),
                             "rss_file_bytes": int(figures[2])})
        self._show(-1)
        self._t0 = time.perf_counter()

    def _show(self, first: int) -> None:
        """Rank 0 prints the records from ``first`` on as they end (a dilated start-up takes minutes)."""
        if dist.get_rank() != 0:
            return
        for rec in self.records[first:]:
            print(f"[bench] {rec['phase']}: {rec['s']:.1f} s, peak RSS {rec['peak_rss_bytes'] / 1e9:.2f} GB a rank"
                  f" (mapped files {rec.get('rss_file_bytes', 0) / 1e9:.2f})", file=sys.stderr, flush=True)

    def end_apart(self, name: str, apart: str, apart_s: float) -> None:
        """The phase ``name`` ends now, less ``apart_s`` of it (this rank's), recorded as the phase ``apart``
        after it: run-time ``auto``'s warm-up, done while the rows are built, is not start-up."""
        import torch

        now = time.perf_counter()
        total, rss = now - self._t0, float(vm_hwm_bytes())
        figures = torch.tensor([total - apart_s, apart_s, rss, float(rss_file_bytes())], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        for phase, s in ((name, figures[0]), (apart, figures[1])):
            self.records.append({"phase": phase, "s": float(s), "peak_rss_bytes": int(figures[2]),
                                 "rss_file_bytes": int(figures[3])})
        self._show(-2)
        self._t0 = time.perf_counter()
