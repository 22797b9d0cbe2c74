"""Issue 39 item 4: no bench row silently runs below the lower bound.

The bound is computed from measurements (the compute-only reference's median step, the
network probe's prices) and a row can beat them: ``mlp`` on the testbed with 2 rounds x
2 steps printed ``/ lower bd 0.74x``.  Every row below the bound now says which of its
assumptions it broke, in the JSON (``below_bound``) and under the table; a row at or above
it says nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import profile_and_cluster

from gradsched.calibration.bounds import below_bound, lower_bound_s
from gradsched.commands.bench import rows_for_json, table, with_bound_checks

ASSUMPTIONS = {"compute", "compute or last all-reduce", "network", "sparse"}


def _row(strategy: str, median_s: float, bound: dict, density: float | None = None) -> dict:
    return {"strategy": strategy, "runs": "gradsched", "iteration_s_median": median_s, "speedup_vs_ddp": None,
            "speedup_vs_best_ddp": None, "lower_bound_s": bound["lower_bound_s"],
            "vs_lower_bound": median_s / bound["lower_bound_s"], "predicted_iteration_s": median_s,
            "prediction_error": 0.0, "warmup_rounds": 1,
            "plan_options": {} if density is None else {"density": density}}


def _result(bound: dict, rows: list[dict], ref_steps: list[list[float]]) -> dict:
    return {"rows": rows, "lower_bound": bound, "best_ddp": None, "contention": None,
            "compute_only": {"iteration_s_median": bound["compute_s"], "step_s": ref_steps},
            "world_size": 2, "backend": "gloo", "machine": "test", "profile": {}, "cluster": {}, "job_s": 1.0}


@settings(max_examples=60, deadline=None)
@given(pc=profile_and_cluster(), fractions=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=6),
       sparse=st.lists(st.booleans(), min_size=6, max_size=6))
def test_every_row_below_the_bound_says_which_assumption_it_broke(pc, fractions, sparse):
    profile, cluster = pc
    bound = lower_bound_s(profile, cluster)
    rows = [_row(f"s{i}", f * bound["lower_bound_s"], bound, 0.01 if sparse[i] else None)
            for i, f in enumerate(fractions)]
    result = with_bound_checks(_result(bound, rows, [[bound["compute_s"]] * 2] * 2))
    text = table(result).splitlines()
    for i, row in enumerate(result["rows"]):
        below = row["iteration_s_median"] < bound["lower_bound_s"]
        assert (row["below_bound"] is not None) == below
        explained = [ln for ln in text if ln.startswith(f"! s{i} ran below the lower bound")]
        assert len(explained) == int(below)
        assert text[1 + i].startswith(f"s{i} ") and ("!" in text[1 + i]) == below  # marked in its row
        if below:
            assert row["below_bound"]["assumption"] in ASSUMPTIONS
            assert (row["below_bound"]["assumption"] == "sparse") == sparse[i]
            assert f"{row['vs_lower_bound']:.2f}x the bound" in row["below_bound"]["reason"]
    assert all("below_bound" in r for r in rows_for_json(result, {}))  # and in the JSON


def _bound(compute_s: float, allreduce_all_s: float) -> dict:
    """A bound with compute ``compute_s`` and one all-reduce of everything ``allreduce_all_s``."""
    compute_bound, network_bound = compute_s + 0.1 * allreduce_all_s, 0.2 * compute_s + allreduce_all_s
    return {"lower_bound_s": max(compute_bound, network_bound), "compute_s": compute_s,
            "allreduce_all_s": allreduce_all_s, "compute_bound_s": compute_bound, "network_bound_s": network_bound,
            "contention_bound_s": max(compute_bound, network_bound)}


def test_the_issues_row_blames_a_compute_reference_of_two_steps():
    """Compute-bound, 2 counted reference steps of which one was slow: the row at 0.74x names the compute,
    the reference's spread, and asks for more steps."""
    bound = _bound(compute_s=0.004, allreduce_all_s=0.001)
    row = _row("ddp", 0.74 * bound["lower_bound_s"], bound)
    got = below_bound(row, bound, {"step_s": [[0.010, 0.010], [0.0031, 0.0049]]})  # first round: warm-up
    assert got["assumption"] == "compute"
    assert "0.74x the bound" in got["reason"] and "4.00 ms" in got["reason"]
    assert "its 2 steps ranged 3.10-4.90 ms" in got["reason"] and "--rounds, --steps" in got["reason"]


def test_many_reference_steps_do_not_ask_for_more():
    bound = _bound(compute_s=0.004, allreduce_all_s=0.001)
    got = below_bound(_row("wfbp", 0.00405, bound), bound, {"step_s": [[0.004] * 6] * 3})
    assert got["assumption"] == "compute or last all-reduce" and "--rounds" not in got["reason"]


def test_a_network_bound_row_blames_the_probe():
    bound = _bound(compute_s=0.001, allreduce_all_s=0.010)
    got = below_bound(_row("usbyte", 0.008, bound), bound, {"step_s": [[0.001] * 4] * 2})
    assert got["assumption"] == "network" and "10.00 ms" in got["reason"] and "probe" in got["reason"]


def test_rows_at_or_above_the_bound_are_not_marked():
    bound = _bound(compute_s=0.004, allreduce_all_s=0.001)
    assert below_bound(_row("ddp", bound["lower_bound_s"], bound), bound) is None
    assert below_bound(_row("ddp", 2 * bound["lower_bound_s"], bound, density=0.01), bound, sparse=True) is None


def test_the_measured_row_below_the_bound_is_explained_by_the_network():
    """The testbed run of the issue, again (benchmarks/results/bench_mlp_2_steps_below_bound.json: `gradsched
    bench --model mlp --rounds 2 --steps 2 --prefix qb`): ddp-100mb at 0.73x moved all 135 kB of gradients, with
    its compute, in less than the probe's price of one all-reduce of them; the compute-only steps were steady."""
    import json
    from pathlib import Path

    rows = json.loads(Path(__file__).parents[1].joinpath("benchmarks/results/bench_mlp_2_steps_below_bound.json")
                      .read_text())
    explained = {r["strategy"]: below_bound(r, r["lower_bound"], r["compute_only"]) for r in rows}
    assert [s for s, why in explained.items() if why] == ["ddp-100mb"]
    assert explained["ddp-100mb"]["assumption"] == "network"
    assert "0.73x the bound" in explained["ddp-100mb"]["reason"] and "2.48 ms" in explained["ddp-100mb"]["reason"]
