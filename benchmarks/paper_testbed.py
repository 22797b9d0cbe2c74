"""What the two papers' testbed experiments share: rates, dilation, one bench per host count, fidelity.

Used by ``benchmarks/paper_mgwfbp_testbed.py`` and ``benchmarks/paper_usbyte_testbed.py``
(docs/bench.md, "The papers' experiments on the testbed"; the runs:
docs/notes/2026-12-bench-runs.md).  Each run is one
``gradsched bench --replay`` on the testbed (emulated compute, real gloo
communication over shaped links, rows in interleaved rounds, medians), at the
emulated cluster's link rate and the smallest dilation that keeps the links'
summed shaped rate within ``FAITHFUL_AGGREGATE_BPS`` (what this machine was measured
to move faithfully: docs/bench.md, "How far emulation is faithful here").  Each run's
own measurements then say whether it stayed faithful: its all-reduce table against the
shaped rate's line, and its compute-only step against the replayed profile.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from gradsched.cli import main as gradsched
from gradsched.commands.bench import FAITHFUL_AGGREGATE_BPS
from gradsched.profile import Profile
from gradsched.testbed import parse_rate_bps

ROOT = Path(__file__).resolve().parent.parent  # the runs' working directory: paths in commands are from it
RESULTS = ROOT / "benchmarks" / "results"
GOODPUT = 0.96  # TCP payload per tbf bit at MTU 1500 (docs/testbed.md; benchmarks/replay_fidelity.py)
MiB = 1 << 20
FIDELITY_SIZES = (4 * MiB, 64 * MiB)  # all-reduce sizes judged against the rate's line (replay_fidelity.py's)
FAITHFUL_NETWORK = 1.10  # worst all-reduce / line tolerated (replay_fidelity.py: 1.02-1.11 within the limit)
FAITHFUL_COMPUTE = 1.10  # compute-only step / replayed profile's compute tolerated


def ring_line_s(size: float, hosts: int, bps: float) -> float:
    """A ring all-reduce of ``size`` bytes over links of ``bps`` at TCP goodput: the rate's line."""
    return 2 * (hosts - 1) / hosts * size * 8 / (GOODPUT * bps)


def link_rate_bps(beta_s_per_byte: float, hosts: int) -> int:
    """The link rate whose ring all-reduce has ``beta`` seconds per byte (the inverse of :func:`ring_line_s`)."""
    return round(2 * (hosts - 1) / hosts * 8 / (GOODPUT * beta_s_per_byte))


def dilation(rate_bps: float, hosts: int) -> float:
    """The smallest dilation (to 0.1) that keeps ``hosts`` links at ``rate / K`` within the faithful total."""
    return max(1.0, math.ceil(rate_bps * hosts / FAITHFUL_AGGREGATE_BPS * 10) / 10)


def load_average() -> list[float]:
    """``uptime``'s load averages (1, 5, 15 minutes): the machine is shared, figures are under load."""
    return [round(x, 2) for x in os.getloadavg()]


def bench_argv(replay: str, hosts: int, rate_bps: int, dilate: float, strategies: str, opts: list[str],
               steps: int, rounds: int, prefix: str, out: Path) -> list[str]:
    """The ``gradsched bench`` command line of one run, paths from the repository's root (no probe: compute is
    replayed, and the rows are what count; no DDP bucket sweep: the papers' rows only)."""
    argv = ["bench", "--replay", replay, "--hosts", str(hosts), "--rate", f"{rate_bps // 10**6}mbit",
            "--dilate", f"{dilate:g}", "--prefix", prefix,
            "--strategies", strategies, "--ddp-buckets", "none", "--steps", str(steps), "--rounds", str(rounds),
            "--no-probe", "--resample-share", "0", "--profile-iterations", "3", "--net-reps", "3", "-q",
            "--json", relative(out)]
    for opt in opts:
        argv += ["--opt", opt]
    return argv


class _Tee(io.TextIOBase):
    """Writes to stderr and keeps a copy (a refusal's one line goes into the JSON)."""

    def __init__(self) -> None:
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        sys.__stderr__.write(text)
        return self.kept.write(text)


def run_bench(argv: list[str]) -> tuple[int, str]:
    """Run ``gradsched bench`` in this process: its exit status and the last line it wrote to stderr."""
    tee = _Tee()
    with contextlib.redirect_stderr(tee), contextlib.chdir(ROOT):
        code = gradsched(argv)
    lines = [ln for ln in tee.kept.getvalue().splitlines() if ln.strip()]
    return code, lines[-1] if lines else ""


def network_fidelity(row: dict[str, Any]) -> dict[str, Any]:
    """The run's all-reduce table (its own seconds) against the shaped links' line, 4-64 MiB."""
    hosts, shaped = row["hosts"], parse_rate_bps(row["rate"]) / row.get("dilate", 1.0)
    points = [(s, t) for s, t in row["cluster"]["points"]["allreduce"] if FIDELITY_SIZES[0] <= s <= FIDELITY_SIZES[1]]
    ratios = {f"{s / MiB:g}": t / ring_line_s(s, hosts, shaped) for s, t in points}
    return {"allreduce_over_line": ratios, "worst": max(ratios.values()) if ratios else None}


def run_fidelity(row: dict[str, Any], replayed: Profile) -> dict[str, Any]:
    """Did the run stay faithful?  Network (worst all-reduce / line) and compute (compute-only step / profile)."""
    net = network_fidelity(row)
    compute = row["compute_only"]["iteration_s_median"] / replayed.compute_s
    problems = []
    if net["worst"] is None or net["worst"] > FAITHFUL_NETWORK:
        problems.append(f"all-reduce up to {net['worst'] or float('nan'):.2f}x the shaped rate's line "
                        f"(tolerated {FAITHFUL_NETWORK:.2f}x)")
    if compute > FAITHFUL_COMPUTE:
        problems.append(f"compute-only step {compute:.2f}x the replayed profile's compute "
                        f"(tolerated {FAITHFUL_COMPUTE:.2f}x)")
    return {"network": net, "compute_only_over_profile": compute, "faithful": not problems, "problems": problems}


def measured(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per row of one bench JSON: measured and predicted median iteration (emulated ms), operations."""
    return {r["strategy"]: {"measured_ms": r["iteration_s_median"] * 1e3, "predicted_ms": r["predicted_iteration_s"] * 1e3,
                            "prediction_error": r["prediction_error"], "operations": r["operations"],
                            "rounds_ms": [statistics.median(s) * 1e3 for s in r["step_s"][r["warmup_rounds"]:]]}
            for r in rows}


def speedups(times: dict[str, float], ours: str, others: tuple[str, ...]) -> dict[str, float]:
    """``other / ours`` per other strategy: how much faster ``ours`` is (above 1: faster)."""
    return {f"{ours}_over_{o}": times[o] / times[ours] for o in others if o in times and ours in times}


def regime(rows: list[dict[str, Any]]) -> float:
    """One all-reduce of all gradients (the run's cost model) over the compute-only step."""
    lb = rows[0]["lower_bound"]
    return lb["allreduce_all_s"] / lb["compute_s"]


def relative(path: Path) -> str:
    """``path`` from the repository's root where it lies inside it (the JSON names committed files so)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


def earlier_runs(out: Path, table_only: bool, script: str, argv: list[str] | None
                 ) -> tuple[dict[str, dict[str, Any]] | None, str]:
    """What a paper script's ``main`` summarises from, and the command its JSON records: with ``--table-only`` the runs
    of the summary it wrote before (``out``; :func:`run_all`'s ``earlier``, by raw path) and the command that ran
    them; else None (run them) and this command (``benchmarks/SCRIPT`` with ``argv``, else the process's)."""
    command = " ".join(["python", f"benchmarks/{script}", *(argv or sys.argv[1:])])
    if not table_only:
        return None, command
    old = json.loads(out.read_text()) if out.exists() else {"runs": []}
    return {r["raw"]: r for r in old["runs"]}, old.get("command", command)


def run_all(plans: list[dict[str, Any]], summarise: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]],
            earlier: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each planned run (``argv``, ``raw`` JSON path, facts), then its summary; a refused or failed run is a row too.

    ``earlier``: summarise the raw JSON files already written instead of running (``--table-only``);
    the rows of the summary that wrote them, by raw path, keep their load and exit status."""
    out = []
    for plan in plans:
        row = {k: v for k, v in plan.items() if k not in ("argv", "raw")}
        raw = Path(plan["raw"])
        row.update(command="gradsched " + " ".join(plan["argv"]), raw=relative(raw))
        if earlier is None:
            load_before = load_average()
            code, last = run_bench(plan["argv"])
            row.update(load_before=load_before, load_after=load_average())
        else:
            old = earlier.get(row["raw"], {})
            code, last = old.get("exit_status", 0), old.get("message", "")
            row.update({k: old[k] for k in ("load_before", "load_after") if k in old})
        if code != 0 or not raw.exists():
            row.update(status="refused" if code == 2 else "failed", exit_status=code, message=last)
            out.append(row)
            continue
        rows = json.loads(raw.read_text())
        row.update(status="ran", date=rows[0]["date"])
        out.append({**row, **summarise(plan, rows)})
    return out
