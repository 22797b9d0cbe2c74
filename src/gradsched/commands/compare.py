"""``gradsched compare``: a measured trace against the simulator's prediction."""

from __future__ import annotations

import argparse
import math
from typing import Any

from gradsched import _validate as v
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import FormatError, GradschedError
from gradsched.fidelity import aligned_iteration, compare
from gradsched.timeline import Timeline


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare a measured trace with a predicted one",
                       description="Per-operation and per-iteration errors of a simulated run (gradsched simulate "
                                   "--trace) against a measured one (gradsched train --trace), and both timelines "
                                   "in one picture.")
    p.add_argument("measured", help="Chrome trace written by gradsched train --trace")
    p.add_argument("predicted", help="Chrome trace written by gradsched simulate --trace (one strategy)")
    p.add_argument("--rank", type=int, default=0, help="measured rank to compare (default 0)")
    p.add_argument("--plot", metavar="OUT.png", help="draw the prediction above one measured iteration")
    add_json_arg(p, "the report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    measured = Timeline.from_chrome_trace(_trace(args.measured))
    raw = _trace(args.predicted)
    predicted = Timeline.from_chrome_trace(raw)
    iteration_s = raw.get("otherData", {}).get("iteration_s")
    if not isinstance(iteration_s, (int, float)):
        raise GradschedError(f"{args.predicted}: otherData.iteration_s: missing; write it with "
                             "`gradsched simulate --strategy ONE --trace FILE`")
    report = compare(measured, predicted, float(iteration_s), rank=args.rank)
    if args.plot:
        from gradsched.plot import gantt

        gantt([("predicted", predicted), ("measured", aligned_iteration(measured, args.rank))], args.plot)
    emit_json(args, report.to_dict())
    if to_stdout(args):
        return 0
    print(f"iteration: predicted {1e3 * report.predicted_iteration_s:.2f} ms, measured median "
          f"{1e3 * report.measured_iteration_s:.2f} ms over {len(report.measured_iterations)} iterations, "
          f"error {100 * report.iteration_error:+.1f}%")
    print(f"operations: {len(report.ops)} matched, median |duration error| {100 * report.median_abs_op_dur_error:.1f}%, "
          f"median |end error| {1e3 * report.median_abs_op_end_error_s:.2f} ms")
    print(f"{'op':>4} {'pred start':>11} {'meas start':>11} {'pred dur':>9} {'meas dur':>9} {'dur err':>8}")
    for o in report.ops:
        print(f"{o.op:>4} {1e3 * o.predicted_start_s:>9.2f}ms {1e3 * o.measured_start_s:>9.2f}ms "
              f"{1e3 * o.predicted_dur_s:>7.2f}ms {1e3 * o.measured_dur_s:>7.2f}ms {100 * o.dur_error:>+7.1f}%")
    return 0


def _trace(path: str) -> dict:
    from gradsched._files import MAX_TRACE_BYTES

    data = v.read_json(path, max_bytes=MAX_TRACE_BYTES)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise GradschedError(f"{path}: traceEvents: missing; not a Chrome trace")
    for j, ev in enumerate(data["traceEvents"]):
        _check_event(ev, path, f"traceEvents[{j}]")
    return data


def _check_event(ev: Any, path: str, where: str) -> None:
    """The fields gradsched reads from a Chrome-trace event, present and of the right type."""
    if not isinstance(ev, dict):
        raise FormatError(path, where, "must be a JSON object")
    if ev.get("ph") == "M" and ev.get("name") == "thread_name":
        for key in ("pid", "tid"):
            v.integer(v.require(ev, key, path, where), path, f"{where}.{key}", minimum=-(2**62))
        args = v.require(ev, "args", path, where)
        v.string(v.require(args, "name", path, f"{where}.args"), path, f"{where}.args.name")
    elif ev.get("ph") == "X":
        v.string(v.require(ev, "name", path, where), path, f"{where}.name")
        for key in ("pid", "tid"):
            v.integer(v.require(ev, key, path, where), path, f"{where}.{key}", minimum=-(2**62))
        ts = v.require(ev, "ts", path, where)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise FormatError(path, f"{where}.ts", f"must be a finite number of microseconds, got {ts!r}")
        v.number(v.require(ev, "dur", path, where), path, f"{where}.dur", maximum=v.MAX_SECONDS * 1e6)
