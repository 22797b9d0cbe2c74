"""Clean exit: a user's training script run as whole torchrun jobs, counted for a non-zero exit
or an abort at interpreter exit ("terminate called without an active exception").

    python benchmarks/clean_exit.py [--runs 30] [--lanes 2]

The script is ``tests/torch/scripts/user_loop.py``: it wraps a small model in
``gradsched.torch.DistributedDataParallel`` with a strategy, trains a few steps and returns,
with or without ``destroy_process_group()``.  Runs cycle through five strategies x both
endings, ``--lanes`` jobs at a time (one job's launcher imports torch while another's
workers run, as on a busy machine).  The test suite runs six of the
cases, every strategy (tests/torch/test_clean_exit.py); this is the long count.  Pass: every run exits 0.
Writes benchmarks/results/clean_exit.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "torch" / "scripts" / "user_loop.py"
STRATEGIES = ("wfbp", "mgwfbp", "bytescheduler", "usbyte", "ddp")
CASES = tuple(itertools.product(STRATEGIES, (True, False)))


def start(strategy: str, destroy: bool) -> subprocess.Popen:
    """One torchrun job of the user's script on 2 local ranks."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
            str(SCRIPT), strategy] + ([] if destroy else ["--no-destroy"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


CAUSE_CUES = ("terminate called", "what():", "Traceback", "Error", "Fatal Python error")


def cause_lines(err: str, most: int = 6) -> str:
    """The ranks' own lines that say why a job failed (torchrun's summary, the tail, names only the signal)."""
    return "\n".join([line for line in err.splitlines() if any(c in line for c in CAUSE_CUES)][:most])


def run_jobs(runs: int, lanes: int, cases: tuple[tuple[str, bool], ...] = CASES) -> list[dict]:
    """``runs`` jobs cycling through ``cases``, ``lanes`` at a time; one record per job (case, exit
    status, abort seen)."""
    cases = list(itertools.islice(itertools.cycle(cases), runs))
    records = []
    for batch in (cases[i:i + lanes] for i in range(0, runs, lanes)):
        procs = [(case, start(*case)) for case in batch]
        for (strategy, destroy), proc in procs:
            _, err = proc.communicate(timeout=300)
            records.append({"strategy": strategy, "destroy": destroy, "exit": proc.returncode,
                            "aborted": "terminate called" in err,
                            "stderr_tail": (cause_lines(err) + "\n...\n" + err[-600:]
                                            if proc.returncode or "terminate called" in err else "")})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "clean_exit.json"))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    records = run_jobs(args.runs, args.lanes)
    bad = [r for r in records if r["exit"] != 0 or r["aborted"]]
    print(f"{'strategy':<14} {'destroy':>7} {'runs':>5} {'failed':>6}")
    for strategy, destroy in CASES:
        mine = [r for r in records if (r["strategy"], r["destroy"]) == (strategy, destroy)]
        print(f"{strategy:<14} {str(destroy):>7} {len(mine):>5} {sum(r in bad for r in mine):>6}")
    seconds = time.monotonic() - t0
    verdict = "PASS" if not bad else "FAIL"
    print(f"{verdict}: {len(records) - len(bad)}/{len(records)} runs exited 0 in {seconds:.0f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    Path(args.json).write_text(json.dumps({"runs": len(records), "failed": len(bad), "seconds": round(seconds, 1),
                                           "load_1min": os.getloadavg()[0], "records": records}, indent=1) + "\n")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
