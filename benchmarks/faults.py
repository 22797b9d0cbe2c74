"""Faults: a rank killed (SIGKILL) or frozen (SIGSTOP) mid-training, under every plan; how long the survivor
takes to raise, and to exit.

    python benchmarks/faults.py [--timeout-s 5] [--pg-timeout default] [--plans wfbp,ddp] [--faults kill,stop]

Each case runs 2 ranks on loopback (gloo), the ``mlp`` model, batch 8,
``DistributedDataParallel(module, plan, timeout_s=...)`` with a ``DistributedOptimizer``.
At step 3 rank 1 either dies (``os._exit``: what SIGKILL leaves behind, the process gone
and its sockets closed) or stops itself with SIGSTOP (frozen: sockets open, nothing
answers).  Rank 0 lets the error propagate uncaught, as a script without a handler does,
so its exit goes through interpreter finalisation.  Times are from the fault (rank 1's
stamp just before it) on one clock: ``error_s`` to rank 0's exception, ``exit_s`` to its
process ending.  The process group's timeout is gloo's default (30 minutes) unless
``--pg-timeout`` says otherwise: the case where an exit used to hang.  Pass: every
survivor raises ``CollectiveError`` and exits within ``timeout_s + 10`` s of its error
(docs/runtime.md, "Failures").  Writes benchmarks/results/faults.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PLANS = ("default", "ddp", "ddp-executor", "wfbp", "sync", "threshold", "horovod", "mgwfbp", "optimal",
         "bytescheduler", "usbyte", "topk", "omgs", "auto")
FAULTS = ("kill", "stop")
EXIT_CAP_S = 120.0  # a survivor still running this long after its error counts as hung (and is killed)

WORKER = r"""
import datetime, os, signal, sys, time
import torch, torch.distributed as dist
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model
torch.set_num_threads(1)
rank, fault, plan, timeout_s, pg_timeout = (int(os.environ["RANK"]), sys.argv[1], sys.argv[2], float(sys.argv[3]),
                                            sys.argv[4])
if pg_timeout == "default":
    dist.init_process_group("gloo")
else:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(pg_timeout)))
spec = build_model("mlp", seed=0)
name, torch_ddp = {"default": (None, True), "ddp-executor": ("ddp", False)}.get(plan, (plan, True))
model = DistributedDataParallel(spec.module, name, timeout_s=timeout_s, use_torch_ddp=torch_ddp)
opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
gen = torch.Generator().manual_seed(rank)
for step in range(1000):
    if step == 3 and rank == 1:
        print(f"fault {time.time():.4f}", flush=True)
        if fault == "kill":
            os._exit(9)
        os.kill(os.getpid(), signal.SIGSTOP)
    x, y = spec.make_batch(8, gen)
    opt.zero_grad()
    try:
        spec.loss_fn(model(x), y).backward()
        opt.step()
    except Exception as exc:
        print(f"error {time.time():.4f} {type(exc).__name__}", flush=True)
        raise
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stamp(lines: list[str], word: str) -> tuple[float | None, str]:
    """The time on the first of ``lines`` starting with ``word`` (and the rest of it), or None."""
    for line in lines:
        if line.startswith(word + " "):
            parts = line.split()
            return float(parts[1]), " ".join(parts[2:])
    return None, ""


def _collect(stream, into: list[str]) -> threading.Thread:
    """Read ``stream``'s lines into ``into`` on a thread (a survivor that never raises must not block us)."""
    thread = threading.Thread(target=lambda: into.extend(stream), daemon=True)
    thread.start()
    return thread


def run_case(plan: str, fault: str, timeout_s: float, pg_timeout: str) -> dict:
    """One job: 2 ranks, rank 1 failing at step 3; rank 0's times and outcome."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, fault, plan, str(timeout_s), pg_timeout],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    survivor, failing = procs
    record: dict = {"plan": plan, "fault": fault}
    try:
        failing_lines: list[str] = []
        for line in failing.stdout:  # start-up takes what a loaded machine needs; the fault comes at step 3
            failing_lines.append(line)
            if line.startswith("fault "):
                break
        fault_at, _ = _stamp(failing_lines, "fault")
        lines: list[str] = []
        errors: list[str] = []
        reader, _ = _collect(survivor.stdout, lines), _collect(survivor.stderr, errors)  # no pipe fills up
        try:
            survivor.wait(timeout=EXIT_CAP_S + timeout_s)
            exited = time.time()
        except subprocess.TimeoutExpired:
            exited = None
        reader.join(timeout=1.0)
        error_at, error = _stamp(lines, "error")
        record.update(error=error or None, exit_code=survivor.poll())
        record["error_s"] = round(error_at - fault_at, 2) if error_at and fault_at else None
        record["exit_s"] = round(exited - fault_at, 2) if exited and fault_at else None
        record["exit_after_error_s"] = round(exited - error_at, 2) if exited and error_at else None
        if error_at is None:
            record["stderr_tail"] = "".join(errors)[-800:]
    finally:
        for p in procs:
            if p.poll() is None:
                if p is failing:
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
    record["ok"] = (record.get("error") == "CollectiveError" and record.get("exit_after_error_s") is not None
                    and record["exit_after_error_s"] <= timeout_s + 10)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=5.0, help="the wrapper's timeout_s")
    ap.add_argument("--pg-timeout", default="default", help="init_process_group's timeout in seconds, or 'default'")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "faults.json"))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    records = []
    print(f"{'plan':<14} {'fault':<5} {'error':<16} {'error_s':>8} {'exit_s':>7} {'after':>6} {'code':>5}  ok")
    for plan in args.plans.split(","):
        for fault in args.faults.split(","):
            r = run_case(plan.strip(), fault.strip(), args.timeout_s, args.pg_timeout)
            records.append(r)
            print(f"{plan:<14} {fault:<5} {str(r['error']):<16} {_fmt(r['error_s']):>8} {_fmt(r['exit_s']):>7} "
                  f"{_fmt(r['exit_after_error_s']):>6} {str(r['exit_code']):>5}  {'yes' if r['ok'] else 'NO'}",
                  flush=True)
    bad = [r for r in records if not r["ok"]]
    seconds = time.monotonic() - t0
    print(f"{'PASS' if not bad else 'FAIL'}: {len(records) - len(bad)}/{len(records)} survivors raised "
          f"CollectiveError and exited within timeout_s + 10 s of it ({seconds:.0f} s, "
          f"load {os.getloadavg()[0]:.1f})")
    Path(args.json).write_text(json.dumps({
        "command": "python benchmarks/faults.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "timeout_s": args.timeout_s, "pg_timeout": args.pg_timeout, "ranks": 2, "model": "mlp",
        "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1), "load_1min": os.getloadavg()[0],
        "records": records}, indent=1) + "\n")
    return 0 if not bad else 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())
