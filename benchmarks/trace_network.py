"""Where a network-bound iteration's time goes: one plan traced on the testbed, as planned
and with one operation in flight at a time.

    python benchmarks/trace_network.py          # gpt-6x512 on 2 hosts at 1 Gbit/s (root; ~3 min)

The replayed GPT of ``benchmarks/profiles/gpt-6x512.profile.json`` on 2 testbed hosts
is the emulated row furthest from its lower bound (docs/bench.md): one all-reduce of all
its gradients takes 1.5x its compute, so the network, not compute, sets the pace.
This script plans ``usbyte`` with the options run-time ``auto`` settled on there and
with the network that run measured (``benchmarks/results/bench_replay_gpt_6x512_2h.json``),
predicts it (``gradsched simulate --trace``) and trains it twice with ``--trace``: as
planned, where every operation goes to gloo as soon as its gradients are ready (gloo
runs up to two collectives at once on its two threads), and with a one-byte credit window,
where the executor issues an operation only when the previous one completed (one at a
time, as the simulator's single channel assumes).

Per run, medians over the traced iterations after warm-up (rank 0, times from backward's
start): the iteration, when backward ends, when the network last completes an
operation, the first forward layer's wait, and, per operation, its time on the wire:
completion minus the later of its issue and the previous completion (exact with one in
flight; with two it splits their shared time between them).  Prints a table and writes
``benchmarks/results/trace_network_gpt_2h.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from gradsched.calibration import lower_bound_s
from gradsched.cli import main as gradsched
from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.timeline import BACKWARD, COMM, WAIT, Event, Timeline

ROOT = Path(__file__).parent
RESULTS = ROOT / "results"
PROFILE = ROOT / "profiles" / "gpt-6x512.profile.json"
BENCH = RESULTS / "bench_replay_gpt_6x512_2h.json"


def _events(path: Path, rank: int = 0) -> list[Event]:
    """``rank``'s spans of a Chrome trace (gradsched's reader: seconds, categories as written)."""
    return [e for e in Timeline.from_chrome_trace(json.loads(path.read_text())).events if e.rank == rank]


def _iteration(e: Event) -> int | None:
    return (e.args or {}).get("iteration")


def iteration_breakdown(events: list[Event], iteration: int) -> dict:
    """One measured iteration of a ``gradsched train --trace`` file, times in ms from backward's start.

    An operation's time on the wire is the rule of :func:`gradsched.calibration.insitu.service_points`
    (completion minus the later of its issue and the previous completion), kept per operation here."""
    it = [e for e in events if _iteration(e) == iteration]
    backward = [e for e in it if e.cat == BACKWARD]
    ops = sorted((e for e in it if e.cat == COMM), key=lambda e: e.end_s)
    t0 = min(e.start_s for e in backward)
    backward_end = max(e.end_s for e in backward)
    previous = max((e.end_s for e in events if e.cat == COMM and _iteration(e) != iteration
                    and e.end_s <= ops[0].end_s), default=float("-inf"))
    rows = []
    for e in ops:
        on_wire = e.end_s - max(e.start_s, previous)
        rows.append({"op": e.args["op"], "bytes": e.args["bytes"], "issued_ms": (e.start_s - t0) * 1e3,
                     "completed_ms": (e.end_s - t0) * 1e3, "on_wire_ms": on_wire * 1e3,
                     "mb_per_s": e.args["bytes"] / (on_wire * 1e6) if on_wire > 0 else None})
        previous = e.end_s
    next_backward = min((e.start_s for e in events if e.cat == BACKWARD and e.start_s > backward_end),
                        default=float("inf"))
    waits = [e for e in events if e.cat == WAIT and backward_end <= e.start_s < next_backward]
    return {"backward_end_ms": (backward_end - t0) * 1e3, "first_issue_ms": rows[0]["issued_ms"] if rows else None,
            "network_end_ms": rows[-1]["completed_ms"], "on_wire_ms": sum(r["on_wire_ms"] for r in rows),
            "first_forward_wait_ms": waits[0].dur_s * 1e3 if waits else 0.0,
            "forward_waits_ms": sum(e.dur_s * 1e3 for e in waits), "ops": rows}


def predicted_breakdown(predicted: Timeline) -> dict:
    """The simulator's iteration (``gradsched simulate --trace``, backward from t = 0), in ms."""
    ops = predicted.by_cat(COMM)
    backward_end = max(e.end_s for e in predicted.by_cat(BACKWARD))
    waits = sorted((e for e in predicted.by_cat(WAIT) if e.start_s >= backward_end), key=lambda e: e.start_s)
    return {"iteration_ms": predicted.meta["iteration_s"] * 1e3, "backward_end_ms": backward_end * 1e3,
            "network_end_ms": max(e.end_s for e in ops) * 1e3, "on_wire_ms": sum(e.dur_s for e in ops) * 1e3,
            "first_forward_wait_ms": waits[0].dur_s * 1e3 if waits else 0.0}


def summarize(trace: Path, warmup: int) -> dict:
    """Medians over the iterations after ``warmup`` (the last one, cut short by the run's end, left out)."""
    events = _events(trace)
    iterations = sorted({_iteration(e) for e in events if e.cat == COMM})
    kept = iterations[warmup:-1]
    parts = [iteration_breakdown(events, k) for k in kept]
    keys = ("backward_end_ms", "first_issue_ms", "network_end_ms", "on_wire_ms", "first_forward_wait_ms",
            "forward_waits_ms")
    out: dict = {k: statistics.median(p[k] for p in parts) for k in keys}
    big = [r["mb_per_s"] for p in parts for r in p["ops"] if r["bytes"] >= 1 << 20 and r["mb_per_s"]]
    small = [r["on_wire_ms"] for p in parts for r in p["ops"] if r["bytes"] < 1 << 16]
    out.update({"ops_per_iteration": len(parts[0]["ops"]),
                "median_mb_per_s_ops_of_1mib_or_more": statistics.median(big),
                "median_on_wire_ms_ops_under_64kib": statistics.median(small) if small else None,
                "iterations": kept, "ops_median_iteration": parts[len(parts) // 2]["ops"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--json", default=str(RESULTS / "trace_network_gpt_2h.json"))
    args = ap.parse_args(argv)
    bench_rows = json.loads(BENCH.read_text())
    auto_row = next(r for r in bench_rows if r["strategy"] == "auto")
    chosen = auto_row["plan_options"]
    model = f"replay:{PROFILE}"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "cluster.json").write_text(json.dumps(auto_row["cluster"]))
        assert gradsched(["profile", "--model", model, "--iterations", "5", "-o", str(d / "profile.json"), "-q"]) == 0
        opts = [f"--opt={k}={v}" for k, v in chosen["chosen_options"].items()]
        assert gradsched(["plan", "--profile", str(d / "profile.json"), "--cluster", str(d / "cluster.json"),
                          "--workers", "2", "--strategy", chosen["chose"], *opts, "-o", str(d / "plan.json")]) == 0
        assert gradsched(["simulate", "--profile", str(d / "profile.json"), "--cluster", str(d / "cluster.json"),
                          "--workers", "2", "--plan", str(d / "plan.json"), "--trace", str(d / "predicted.json")]) == 0
        plan = Plan.load(d / "plan.json")
        replace(plan, credit_bytes=1).save(d / "one_in_flight.json")
        predicted = Timeline.from_chrome_trace(json.loads((d / "predicted.json").read_text()))
        profile = Profile.load(d / "profile.json")
        bound = lower_bound_s(profile, Cluster.from_dict(auto_row["cluster"]))
        result = {"command": "python benchmarks/trace_network.py", "model": "gpt-6x512 (replayed)", "hosts": 2,
                  "rate": "1gbit", "plan": {"strategy": chosen["chose"], "options": chosen["chosen_options"],
                                            "operations": len(plan.operations)},
                  "predicted": predicted_breakdown(predicted),
                  "lower_bound_ms": bound["lower_bound_s"] * 1e3, "allreduce_all_ms": bound["allreduce_all_s"] * 1e3,
                  "runs": {}}
        for name, plan_file in (("as planned", "plan.json"), ("one in flight", "one_in_flight.json")):
            trace, summary = d / f"{plan_file}.trace.json", d / f"{plan_file}.summary.json"
            assert gradsched(["train", "--model", model, "--workers", "2", "--rate", "1gbit",
                              "--plan", str(d / plan_file), "--steps", str(args.steps), "--warmup", str(args.warmup),
                              "--trace", str(trace), "--json", str(summary)]) == 0
            run = summarize(trace, args.warmup)
            run["iteration_ms"] = json.loads(summary.read_text())["iteration_s_median"] * 1e3
            result["runs"][name] = run
    print(f"{result['plan']['strategy']} {result['plan']['options']}: {result['plan']['operations']} operations; "
          f"lower bound {result['lower_bound_ms']:.0f} ms "
          f"(one all-reduce of everything {result['allreduce_all_ms']:.0f} ms)")
    print(f"{'run':<14} {'iter ms':>8} {'bwd end':>8} {'net end':>8} {'on wire':>8} {'1st wait':>8} "
          f"{'MB/s >=1MiB':>11} {'ms <64KiB':>9}")
    p = result["predicted"]
    print(f"{'predicted':<14} {p['iteration_ms']:8.0f} {p['backward_end_ms']:8.0f} {p['network_end_ms']:8.0f} "
          f"{p['on_wire_ms']:8.0f} {p['first_forward_wait_ms']:8.0f}")
    for name, r in result["runs"].items():
        small = r["median_on_wire_ms_ops_under_64kib"]
        print(f"{name:<14} {r['iteration_ms']:8.0f} {r['backward_end_ms']:8.0f} {r['network_end_ms']:8.0f} "
              f"{r['on_wire_ms']:8.0f} {r['first_forward_wait_ms']:8.0f} "
              f"{r['median_mb_per_s_ops_of_1mib_or_more']:11.1f} "
              f"{small if small is None else round(small, 1)!s:>9}")
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
