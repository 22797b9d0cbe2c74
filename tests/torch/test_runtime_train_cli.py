"""``gradsched train``: launches workers with PyTorch's launcher, reports JSON, saves parameters and a trace."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gradsched.cli import main  # noqa: E402
from gradsched.timeline import Timeline  # noqa: E402


@pytest.mark.slow
def test_train_json_params_and_trace_match_torch_ddp(tmp_path, capsys):
    common = ["train", "--nproc", "2", "--model", "mlp", "--steps", "4", "--warmup", "1", "--json"]
    assert main(common + ["--strategy", "mgwfbp", "--save-params", str(tmp_path / "g.pt"),
                          "--trace", str(tmp_path / "t.json")]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert main(common + ["--strategy", "ddp", "--save-params", str(tmp_path / "d.pt")]) == 0
    ref = json.loads(capsys.readouterr().out)
    for r, strategy in ((ours, "mgwfbp"), (ref, "ddp")):
        assert r["strategy"] == strategy and r["steps"] == 4 and r["iteration_s_median"] > 0
        assert r["loss_first"] > 0 and r["loss_last"] > 0
    assert ref["torch_ddp"] and not ours["torch_ddp"]
    a, b = torch.load(tmp_path / "g.pt"), torch.load(tmp_path / "d.pt")
    assert a.keys() == b.keys() and "0.weight" in a
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)
    tl = Timeline.from_chrome_trace(json.loads((tmp_path / "t.json").read_text()))
    assert {e.rank for e in tl.events} == {0, 1} and tl.by_cat("comm") and tl.by_cat("backward")


@pytest.mark.parametrize("argv,message", [
    (["--model", "resnet9000"], "unknown model"),
    (["--strategy", "nope"], "unknown strategy"),
    (["--strategy", "topk", "--density", "2"], "--density"),
    (["--strategy", "wfbp", "--density", "0.1"], "--density applies"),
    (["--nproc", "0"], "--workers must be at least 1"),  # --nproc: the old spelling of --workers
    (["--plan", "/nonexistent/plan.json"], "No such file"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["train"] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_train_a_replayed_profile_waits_its_compute_and_matches_torch_ddp(tmp_path, capsys):
    """``--model replay:PROFILE``: the profile's tensors as real parameters, its compute waited out
    (an iteration takes at least the profile's compute), and gradsched's plan reaches DDP's parameters."""
    from gradsched.synthetic import synthetic_profile

    prof = synthetic_profile(12, seed=3, flops_per_s=2e9)  # 141 ms of compute, 2.3 MB
    path = tmp_path / "p.profile.json"
    prof.save(path)
    common = ["train", "--nproc", "2", "--model", f"replay:{path}", "--steps", "3", "--warmup", "1", "--json"]
    assert main(common + ["--strategy", "mgwfbp", "--save-params", str(tmp_path / "g.pt")]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert main(common + ["--strategy", "ddp", "--save-params", str(tmp_path / "d.pt")]) == 0
    ref = json.loads(capsys.readouterr().out)
    compute_s = sum(t.forward_s + t.backward_s for t in prof.tensors)
    for r in (ours, ref):
        assert r["iteration_s_median"] >= compute_s * 0.98
    a, b = torch.load(tmp_path / "g.pt"), torch.load(tmp_path / "d.pt")
    assert len(a) == len(prof.tensors) and a.keys() == b.keys()
    assert [v.numel() for v in a.values()] == [t.numel for t in prof.tensors]
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


def test_train_a_replayed_profile_that_is_missing_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["train", "--model", f"replay:{tmp_path / 'none.json'}", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "none.json" in err and len(err.strip().splitlines()) == 1
