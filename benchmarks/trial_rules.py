"""Which plan would run-time ``auto``'s trials keep under another decision rule?  Offline, from stored results.

    python benchmarks/trial_rules.py [--json benchmarks/results/trial_rules.json] [RESULT.json ...]

Reads every stored trial decision (``autotune.trial_decision`` of an ``auto`` row: each
plan's window medians round by round, the baseline, the plans that are the baseline at
other bucket sizes) in ``benchmarks/results/*.json`` (or the files given) and applies
each rule to the same rounds:

- ``today``: the rule before Dec 7: a plan must beat the baseline's median by ``min_gain``
  and its window in every round;
- ``a``: as ``today``, but a plan whose median beats the baseline by ``min_gain`` and lost a
  round goes to the run-off; after the run-off (stored decisions that had one) it needs
  a majority of the rounds.  Unresolved where the stored run had no run-off (``runoff?``);
- ``b``: a majority of rounds won and a median ``2 * min_gain`` faster;
- ``c``: the median over rounds of its window / the baseline's window of the same round
  at most ``1 - min_gain`` (and the median ``min_gain`` faster);
- ``lib``: :func:`gradsched.calibration.fastest` as installed (the rule this branch keeps).

Plans at another bucket size keep their own rule (``resize_min_gain``, most rounds) in all.
Where the same bench measured the kept plan in its counted rounds (a row of that plan's
hash, the ``auto`` row when it settled on it, PyTorch DDP's ``ddp-XMB`` rows, or ``~`` a row
of the same strategy with other options), the table gives its median over the baseline
row's (``ddp``: PyTorch DDP at the bench's bucket size): the cost of keeping it.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

from gradsched.calibration import fastest

MIN_GAIN, RESIZE_MIN_GAIN = 0.03, 0.01  # gradsched.tuning.config's defaults
Rounds = dict[str, list[float]]
Rule = Callable[[dict[str, float], str, Rounds, list[str]], str]


def _resized_ok(plan: str, measured: dict[str, float], base: str, rounds: Rounds) -> bool:
    wins = [a < b for a, b in zip(rounds.get(plan, []), rounds.get(base, []))]
    return measured[plan] <= measured[base] * (1 - RESIZE_MIN_GAIN) and (not wins or 2 * sum(wins) > len(wins))


def _pick(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str],
          ok: Callable[[str], bool]) -> str:
    won = [h for h in measured if h != base and (_resized_ok(h, measured, base, rounds) if h in resized else ok(h))]
    return min(won, key=measured.__getitem__) if won else base


def _wins(plan: str, base: str, rounds: Rounds) -> list[bool]:
    return [a < b for a, b in zip(rounds.get(plan, []), rounds.get(base, []))]


def rule_today(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str]) -> str:
    return _pick(measured, base, rounds, resized,
                 lambda h: measured[h] <= measured[base] * (1 - MIN_GAIN) and all(_wins(h, base, rounds)))


def rule_a(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str]) -> str:
    kept = rule_today(measured, base, rounds, resized)
    if kept != base:
        return kept
    fast = [h for h in measured if h != base and h not in resized and measured[h] <= measured[base] * (1 - MIN_GAIN)]
    if any(len(_wins(h, base, rounds)) <= 3 for h in fast):  # lost a round, no run-off stored: more turns
        return "runoff?"
    return _pick(measured, base, rounds, resized, lambda h: h in fast and 2 * sum(_wins(h, base, rounds)) > len(
        _wins(h, base, rounds)))


def rule_b(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str]) -> str:
    def ok(h: str) -> bool:
        wins = _wins(h, base, rounds)
        return measured[h] <= measured[base] * (1 - 2 * MIN_GAIN) and 2 * sum(wins) > len(wins)
    return _pick(measured, base, rounds, resized, ok)


def rule_c(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str]) -> str:
    def ok(h: str) -> bool:
        ratios = [a / b for a, b in zip(rounds.get(h, []), rounds.get(base, []))]
        return measured[h] <= measured[base] * (1 - MIN_GAIN) and bool(ratios) and \
            statistics.median(ratios) <= 1 - MIN_GAIN
    return _pick(measured, base, rounds, resized, ok)


def rule_lib(measured: dict[str, float], base: str, rounds: Rounds, resized: list[str]) -> str:
    return fastest(measured, base, MIN_GAIN, rounds, resized, RESIZE_MIN_GAIN)


RULES: dict[str, Rule] = {"today": rule_today, "a": rule_a, "b": rule_b, "c": rule_c, "lib": rule_lib}


def decisions(path: str) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each ``auto`` row with a trial decision that names its baseline and plans, with the rows beside it."""
    def walk(obj: Any) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        if isinstance(obj, list):
            rows = [r for r in obj if isinstance(r, dict) and "strategy" in r]
            for row in rows:
                decision = (row.get("autotune") or {}).get("trial_decision")
                if isinstance(decision, dict) and decision.get("baseline") and decision.get("plans"):
                    yield row, rows
            for item in obj:
                yield from walk(item)
        elif isinstance(obj, dict):
            for value in obj.values():
                yield from walk(value)
    with open(path) as f:
        yield from walk(json.load(f))


def _mb(label: str) -> str:
    size = float(label.split()[1])
    return f"ddp-{int(size)}mb" if size == int(size) else f"ddp-{size:g}mb"


def bench_cost(plan: str, label: str, auto: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The bench's median of the rows that ran ``plan`` over its ``ddp`` row's, and how the row was matched."""
    base = next((r for r in rows if r["strategy"] == "ddp" and r.get("runs") == "torch DDP"), None)
    if base is None or label == "runoff?":
        return None, ""
    by_name = {r["strategy"]: r for r in rows}
    if label == "torch-ddp default":
        row, how = base, "="
    elif label.startswith("torch-ddp "):
        row, how = by_name.get(_mb(label), auto if auto.get("plan_hash") == plan else None), "="
    else:
        row = next((r for r in rows if r.get("plan_hash") == plan and r is not auto), None)
        how = "="
        if row is None and auto.get("plan_hash") == plan:
            row = auto
        if row is None:
            row, how = by_name.get(label), "~"
    if row is None:
        return None, ""
    return row["iteration_s_median"] / base["iteration_s_median"], how


def evaluate(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        for auto, rows in decisions(path):
            d = auto["autotune"]["trial_decision"]
            measured, base, rounds, resized = d["measured"], d["baseline"], d["rounds"], list(d.get("resized") or [])
            entry: dict[str, Any] = {"file": path.split("/")[-1], "hosts": auto.get("hosts"), "stored_kept":
                                     d["plans"].get(d["kept"], d["kept"]), "runoff": bool(d.get("runoff"))}
            for name, rule in RULES.items():
                kept = rule(measured, base, rounds, resized)
                label = d["plans"].get(kept, kept)
                cost, how = bench_cost(kept, label, auto, rows)
                gain = 1 - measured[kept] / measured[base] if kept in measured else None
                entry[name] = {"plan": label, "trial_gain": gain, "bench_vs_ddp": cost, "match": how}
            out.append(entry)
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, Any]:
    result = {}
    for name in RULES:
        costs = [e[name]["bench_vs_ddp"] for e in table if e[name]["bench_vs_ddp"] is not None]
        moved = [e for e in table if e[name]["plan"] not in ("torch-ddp default", "runoff?")]
        result[name] = {"kept_other_than_baseline": len(moved), "unresolved": sum(e[name]["plan"] == "runoff?"
                                                                               for e in table),
                        "with_bench_cost": len(costs), "median_bench_vs_ddp": statistics.median(costs) if costs else None,
                        "worst_bench_vs_ddp": max(costs) if costs else None,
                        "slower_than_ddp": sum(c > 1.0 for c in costs),
                        "changed_from_today": [(e["file"], e["today"]["plan"], e[name]["plan"], e[name]["bench_vs_ddp"])
                                               for e in table if e[name]["plan"] != e["today"]["plan"]
                                               or e[name]["bench_vs_ddp"] != e["today"]["bench_vs_ddp"]]}
    return result


def _cell(cell: dict[str, Any]) -> str:
    cost = "" if cell["bench_vs_ddp"] is None else f" {cell['match']}{cell['bench_vs_ddp']:.2f}"
    return f"{cell['plan'][:18]}{cost}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(glob.glob("benchmarks/results/*.json"))
    table = evaluate(paths)
    print(f"{'file':46} h  " + "  ".join(f"{n:24}" for n in RULES))
    for e in table:
        print(f"{e['file'][:46]:46} {e['hosts'] or '?':<2} " + "  ".join(f"{_cell(e[n]):24}" for n in RULES))
    summ = summary(table)
    same = sum(e["stored_kept"] == e["today"]["plan"] for e in table)
    print(f"today's rule keeps what the stored run kept in {same} of {len(table)} decisions")
    print("cost: the bench's median of that plan over its ddp row (= same plan, ~ same strategy); blank: not measured")
    for name, s in summ.items():
        print(f"{name:6} " + ", ".join(f"{k} {v}" for k, v in s.items() if k != "changed_from_today"))
        for file, was, now, cost in s["changed_from_today"]:
            print(f"         {file}: {was} -> {now}" + ("" if cost is None else f" ({cost:.2f}x the ddp row)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python benchmarks/trial_rules.py --json " + args.json, "min_gain": MIN_GAIN,
                       "resize_min_gain": RESIZE_MIN_GAIN, "today_as_stored": same, "decisions": table,
                       "summary": summ}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
