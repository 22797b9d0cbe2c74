"""The papers' testbed scripts (benchmarks/paper_{mgwfbp,usbyte}_testbed.py) without a testbed.

Their command lines must be ones ``gradsched bench`` accepts (and whose dilation it does
not refuse), and a run's row must read a bench JSON the right way round: speed-ups as
other / ours, a run whose all-reduces fall behind the shaped rate flagged, not hidden."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import paper_mgwfbp_testbed as mg  # noqa: E402
import paper_testbed as pt  # noqa: E402
import paper_usbyte_testbed as us  # noqa: E402

from gradsched.bundled import bundled_profile  # noqa: E402
from gradsched.cli import build_parser  # noqa: E402
from gradsched.commands.bench import FAITHFUL_AGGREGATE_BPS, entries, shaped_rate  # noqa: E402
from gradsched.errors import GradschedError  # noqa: E402
from gradsched.planners import make_plan  # noqa: E402
from gradsched.cluster import Cluster  # noqa: E402


def test_wfbp_layerwise_sends_each_layer_as_one_message() -> None:
    profile = bundled_profile("googlenet-k80")  # 64 layers, a weight and a bias each
    cluster = Cluster.alpha_beta(1e-3, 1e-9, 8)
    per_tensor = make_plan("wfbp", profile, cluster)
    layerwise = make_plan("wfbp", profile, cluster, layerwise=True)
    layerwise.check(profile)
    assert len(per_tensor.operations) == 128 and len(layerwise.operations) == 64
    names = [[profile.tensors[s.tensor].name for s in op.slices] for op in layerwise.operations]
    assert all(len(n) == 2 and n[0].rsplit(".", 1)[0] == n[1].rsplit(".", 1)[0] for n in names)
    assert layerwise.options == {"layerwise": True} and per_tensor.options == {}


@pytest.mark.parametrize("quick,hosts", [(True, [2]), (False, [2, 4, 8])])
def test_mgwfbp_commands_are_accepted_by_bench_at_the_faithful_limit(quick: bool, hosts: list[int]) -> None:
    args = mg.parse(["--quick"] if quick else [])
    runs = mg.plans(args)
    assert [r["hosts"] for r in runs] == hosts
    for run in runs:
        bench = build_parser().parse_args(run["argv"])
        assert (bench.replay, bench.prefix, bench.no_probe) == ("googlenet-k80", "gsp", True)
        wfbp = next(e for e in entries(bench.strategies, bench.ddp_buckets, None, bench.opt) if e["label"] == "wfbp")
        assert wfbp["options"] == {"layerwise": True}
        shaped = shaped_rate(bench.rate, run["hosts"], bench.dilate, True)  # refused beyond the faithful total
        assert shaped * run["hosts"] > 0.95 * FAITHFUL_AGGREGATE_BPS  # the least dilation that fits, not more
        with pytest.raises(GradschedError, match="moves faithfully"):
            shaped_rate(bench.rate, run["hosts"], bench.dilate - 0.1, True)
    # the paper's network as MPI achieved it: 10 GbE links, a few Gbit/s of all-reduce bandwidth
    assert all(3e9 < r["rate_bps"] < 10e9 for r in runs)


def _bench_rows(times_ms: dict[str, float], slow_network: float = 1.0) -> list[dict]:
    """A bench JSON's rows, 2 hosts at 1 Gbit/s shaped, with all-reduces ``slow_network`` x the rate's line."""
    sizes = [2 ** k for k in range(22, 27)]
    points = [[s, slow_network * pt.ring_line_s(s, 2, 1e9)] for s in sizes]
    shared = {"hosts": 2, "rate": "5000mbit", "dilate": 5.0, "warmup_rounds": 1,
              "cluster": {"points": {"allreduce": points}, "collectives": {"allreduce": {"alpha_s": 5e-4}}},
              "compute_only": {"iteration_s_median": 0.40}, "lower_bound": {"allreduce_all_s": 0.1, "compute_s": 0.4}}
    return [{**shared, "strategy": s, "iteration_s_median": t / 1e3, "predicted_iteration_s": t / 1e3 * 0.9,
             "prediction_error": -0.1, "operations": 1, "step_s": [[t / 1e3] * 2] * 3} for s, t in times_ms.items()]


def test_mgwfbp_row_states_speedups_fidelity_and_the_paper() -> None:
    plan = {"hosts": 8, "dilate": 5.0}
    row = mg.summarise(plan, _bench_rows({"sync": 550.0, "wfbp": 480.0, "mgwfbp": 400.0}))
    assert row["measured"] == pytest.approx({"mgwfbp_over_wfbp": 1.2, "mgwfbp_over_sync": 1.375})
    assert row["paper"] == {"mgwfbp_over_wfbp": 1.2, "mgwfbp_over_sync": 1.36}
    assert row["allreduce_over_compute"] == pytest.approx(0.25)
    assert row["simulated_paper"]["mgwfbp_over_sync"] > 1.2  # the simulator on the paper's inputs
    assert row["latency"]["testbed_alpha_emulated_s"] == pytest.approx(1e-4)
    assert row["fidelity"]["faithful"] and row["flag"] is None
    slow = mg.summarise(plan, _bench_rows({"sync": 550.0, "wfbp": 480.0, "mgwfbp": 400.0}, slow_network=1.3))
    assert not slow["fidelity"]["faithful"] and slow["flag"].startswith("NOT FAITHFUL: all-reduce up to 1.30x")


def test_usbyte_runs_parse_and_refuse_bad_input() -> None:
    args = us.parse(["--quick"])
    assert args.runs == [("resnet50", 2)] and args.steps == 1 and args.prefix == "gsp2"
    assert us.parse([]).runs == [("resnet50", 2), ("resnet50", 4), ("resnet50", 8), ("vgg16", 2)]
    for bad in (["--runs", "resnet18:2"], ["--runs", "resnet50:1"], ["--batch-size", "0"]):
        with pytest.raises(SystemExit) as exc:
            us.parse(bad)
        assert exc.value.code == 2
    assert pt.speedups({"usbyte": 100.0, "wfbp": 156.0}, "usbyte", us.OTHERS) == {"usbyte_over_wfbp": 1.56}


def test_table_only_reads_the_runs_and_command_of_the_summary_written_before(tmp_path) -> None:
    """Both scripts' ``--table-only`` (:func:`paper_testbed.earlier_runs`): the rows of the JSON written before, by
    raw path, and the command that ran them; without it, nothing earlier and this command."""
    out = tmp_path / "paper.json"
    assert pt.earlier_runs(out, False, "paper_x.py", ["--quick"]) == (None, "python benchmarks/paper_x.py --quick")
    assert pt.earlier_runs(out, True, "paper_x.py", ["--table-only"]) == ({}, "python benchmarks/paper_x.py --table-only")
    out.write_text('{"command": "python benchmarks/paper_x.py --quick", "runs": [{"raw": "a.json", "exit_status": 2}]}')
    earlier, command = pt.earlier_runs(out, True, "paper_x.py", ["--table-only"])
    assert earlier == {"a.json": {"raw": "a.json", "exit_status": 2}} and command == "python benchmarks/paper_x.py --quick"
