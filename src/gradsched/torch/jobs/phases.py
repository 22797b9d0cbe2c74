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
        figures = torch.tensor([now - self._t0, float(vm_hwm_bytes())], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        self.records.append({"phase": name, "s": float(figures[0]), "peak_rss_bytes": int(figures[1])})
        self._show(-1)
        self._t0 = time.perf_counter()

    def _show(self, first: int) -> None:
        """Rank 0 prints the records from ``first`` on as they end (a dilated start-up takes minutes)."""
        if dist.get_rank() != 0:
            return
        for rec in self.records[first:]:
            print(f"[bench] {rec['phase']}: {rec['s']:.1f} s, peak RSS {rec['peak_rss_bytes'] / 1e9:.2f} GB a rank",
                  file=sys.stderr, flush=True)

    def end_apart(self, name: str, apart: str, apart_s: float) -> None:
        """The phase ``name`` ends now, less ``apart_s`` of it (this rank's), recorded as the phase ``apart``
        after it: run-time ``auto``'s warm-up, done while the rows are built, is not start-up."""
        import torch

        now = time.perf_counter()
        total, rss = now - self._t0, float(vm_hwm_bytes())
        figures = torch.tensor([total - apart_s, apart_s, rss], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        self.records.append({"phase": name, "s": float(figures[0]), "peak_rss_bytes": int(figures[2])})
        self.records.append({"phase": apart, "s": float(figures[1]), "peak_rss_bytes": int(figures[2])})
        self._show(-2)
        self._t0 = time.perf_counter()
