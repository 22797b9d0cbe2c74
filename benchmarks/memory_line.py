"""Every kept bench JSON of 2 or 8 hosts against issue 35's memory line, and the phase that set each peak.

    python benchmarks/memory_line.py [--out benchmarks/results/memory_line.json]

Reads the stored JSONs in ``benchmarks/results/`` (no network, no testbed): a bench's ``peak_rss_bytes`` (the
largest rank's VmHWM), its ``phases`` (the peak so far after each phase) and the parameters' bytes as the ranks
held them (``profile.total_bytes``: after byte scaling, S in ``scale_bytes``).  The line: 3x those bytes + 0.5 GB
(``gradsched.bench_memory.COPIES``).  The phase that set the peak is the first whose peak so far is the job's;
the estimate is ``gradsched.bench_memory.peak_bytes`` for the same model, hosts and rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gradsched.bench_memory import COPIES, peak_bytes

RESULTS = Path(__file__).parent / "results"
LINE_BASE_BYTES = 0.5e9  # issue 35: peak RSS per rank <= 3x the parameters' bytes + 0.5 GB
TWO_PHASE_ROWS = ("dear", "fsdp2")  # rows that run reduce-scatters and all-gathers (run-time auto may try dear)


def bench_rows(path: Path) -> list[dict[str, Any]] | None:
    """A bench JSON's rows (a list of per-strategy dicts with the job's memory figures), else None."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    first = data[0]
    if first.get("peak_rss_bytes") is None or not first.get("phases") or not isinstance(first.get("profile"), dict):
        return None
    return data


def setting_phase(phases: list[dict[str, Any]]) -> str:
    """The first phase whose peak so far is the job's peak."""
    peak = phases[-1]["peak_rss_bytes"]
    return next(p["phase"] for p in phases if p["peak_rss_bytes"] >= peak)


def summary(path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One job's row of the table."""
    first, strategies = rows[0], {r["strategy"] for r in rows}
    profile = first["profile"]
    model_bytes = int(profile["total_bytes"])
    tensors = profile.get("measured", {}).get("tensors", [])
    largest = max((int(t["bytes"]) for t in tensors), default=0)
    line = COPIES * model_bytes + LINE_BASE_BYTES
    phases = {p["phase"]: p["peak_rss_bytes"] for p in first["phases"]}
    two_phase = bool(strategies & {*TWO_PHASE_ROWS, "auto"})
    estimate = peak_bytes(model_bytes, largest, first["world_size"], two_phase)
    return {"file": path.name, "model": Path(str(first["model"]).split(":", 1)[-1]).name.split(".")[0],
            "hosts": first["hosts"], "scale_bytes": first.get("scale_bytes", 1), "strategies": sorted(strategies),
            "date": first.get("date"), "model_bytes": model_bytes, "largest_bytes": largest,
            "peak_rss_bytes": first["peak_rss_bytes"], "line_bytes": line,
            "over_line_bytes": first["peak_rss_bytes"] - line, "missed": first["peak_rss_bytes"] > line,
            "set_by": setting_phase(first["phases"]), "phase_peaks": phases, "estimate_bytes": estimate}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS / "memory_line.json")
    p.add_argument("--hosts", default="2,8", help="comma-separated host counts kept (default 2,8)")
    args = p.parse_args()
    hosts = {int(h) for h in args.hosts.split(",")}
    table = []
    for path in sorted(RESULTS.glob("*.json")):
        rows = bench_rows(path)
        if rows is not None and rows[0].get("hosts") in hosts and path != args.out:
            table.append(summary(path, rows))
    table.sort(key=lambda r: (r["hosts"], -r["over_line_bytes"]))
    args.out.write_text(json.dumps({"line": f"{COPIES}x the parameters' bytes + {LINE_BASE_BYTES / 1e9:g} GB",
                                    "runs": table}, indent=1))
    print(f"{'file':58s} {'h':>2s} {'S':>3s} {'MB':>6s} {'peak':>5s} {'line':>5s} {'est':>5s}  set by (GB)")
    for r in table:
        mark = "MISS" if r["missed"] else "    "
        print(f"{r['file'][:58]:58s} {r['hosts']:2d} {r['scale_bytes']:3d} {r['model_bytes'] / 1e6:6.1f} "
              f"{r['peak_rss_bytes'] / 1e9:5.2f} {r['line_bytes'] / 1e9:5.2f} {r['estimate_bytes'] / 1e9:5.2f} {mark} "
              f"{r['set_by']}; probe {r['phase_peaks'].get('probe', 0) / 1e9:.2f}")
    missed = [r for r in table if r["missed"]]
    print(f"{len(missed)} of {len(table)} runs over the line; set by: "
          + ", ".join(f"{ph} {sum(r['set_by'] == ph for r in missed)}" for ph in sorted({r['set_by'] for r in missed})))


if __name__ == "__main__":
    main()
