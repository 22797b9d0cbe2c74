"""benchmarks/emulate_papers.py's summary of one bench, read from stored 8-host runs (no testbed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import emulate_papers as ep  # noqa: E402


def test_the_summary_names_the_plan_run_time_auto_kept_and_its_warm_up() -> None:
    """VGG-16 (runs9): run-time auto's short warm-up in situ kept usbyte; the summary says so, with the warm-up's
    estimate beside what it took, and counts the start-up without the warm-up and the rounds."""
    out = ep.summary(ep.RESULTS / "emulate_papers_vgg16_8h_runs9.json")
    assert out["auto_ran"] == "usbyte"
    warm = out["auto_warmup"]
    assert warm["mode"].startswith("run-time") and warm["short"]
    assert warm["took_s"] == out["phases_s"]["auto warm-up"] > 0
    assert out["startup_s"] == sum(s for p, s in out["phases_s"].items() if p not in ("rounds", "auto warm-up"))
    assert out["trimmed"]["rounds"] == out["stopping"]["rounds_run"] == 4  # the fit after start-up cut the rounds


def test_the_summary_names_pytorch_ddp_where_the_trials_kept_it_and_the_choice_where_planned_at_start_up() -> None:
    kept = ep.summary(ep.RESULTS / "emulate_papers_resnet50_8h_runs9.json")
    assert kept["auto_ran"] == "torch-ddp 3.125 MB"  # the ddp row's 25 MB at byte scale 8
    planned = ep.summary(ep.RESULTS / "emulate_papers_bert_large_8h_nodear.json")
    assert planned["auto_ran"] == "usbyte" and planned["auto_warmup"]["took_s"] == 0.0
    assert planned["auto_warmup"]["mode"] == "planned at start-up"


def test_strategies_adds_rows_after_ddp_and_auto_once_each_and_the_default_is_unchanged() -> None:
    default = ep.parser().parse_args([])
    assert ep.strategies(default.strategies) == "ddp,auto"
    assert ep.strategies("dear") == "ddp,auto,dear"
    assert ep.strategies("auto, dear,usbyte,dear,") == "ddp,auto,dear,usbyte"


def test_the_bench_is_given_the_extra_rows_and_the_models_settings() -> None:
    args = ep.parser().parse_args(["--strategies", "dear", "--prefix", "gsx", "--rounds", "4"])
    cmd = ep.bench_command("bert-base", args, Path("out.json"))
    flag = {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}
    assert flag["--strategies"] == "ddp,auto,dear"
    assert (flag["--dilate"], flag["--scale-bytes"], flag["--prefix"], flag["--rounds"]) == ("2.5", "16", "gsx", "4")
    assert flag["--json"] == "out.json" and "--ddp-buckets" not in flag  # the bucket sweep stays the bench's
    plain = ep.bench_command("bert-base", ep.parser().parse_args([]), Path("out.json"))
    assert "--rounds" not in plain and plain[plain.index("--strategies") + 1] == "ddp,auto"


def test_the_summary_gives_every_rows_median_and_prediction() -> None:
    out = ep.summary(ep.RESULTS / "emulate_papers_vgg16_8h_runs10.json")
    assert set(out["rows"]) == set(out["errors"]) and "auto" in out["rows"]
    auto = out["rows"]["auto"]
    assert auto["predicted_s"] == pytest.approx(auto["median_s"] * (1 + out["errors"]["auto"]), rel=1e-6)
    assert out["rows"]["ddp"]["vs_ddp"] == pytest.approx(1.0)
