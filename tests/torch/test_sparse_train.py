"""``gradsched train --strategy topk|omgs --density D``: runs, reports ``peak_extra_bytes``."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gradsched.cli import main  # noqa: E402


@pytest.mark.slow
def test_train_sparse_reports_memory_near_dense(capsys):
    common = ["train", "--nproc", "2", "--model", "mlp", "--steps", "4", "--warmup", "1", "--json"]
    out = {}
    for name, extra in (("wfbp", ["--strategy", "wfbp"]),
                        ("omgs", ["--strategy", "omgs", "--density", "0.01"]),
                        ("naive", ["--strategy", "topk", "--density", "0.01", "--sparse", "memory=naive",
                                   "--sparse", "selection=sampled"])):
        assert main(common + extra) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert out["omgs"]["strategy"] == "omgs" and out["omgs"]["density"] == 0.01
    assert out["wfbp"]["density"] is None
    params_bytes = out["wfbp"]["params"] * 4
    assert out["wfbp"]["peak_extra_bytes"] >= params_bytes  # the gradient buffer
    assert out["omgs"]["peak_extra_bytes"] <= 1.3 * out["wfbp"]["peak_extra_bytes"]
    assert out["naive"]["peak_extra_bytes"] >= 2 * params_bytes
    for r in out.values():
        assert r["loss_last"] == r["loss_last"] and r["loss_last"] > 0  # finite


def test_bad_sparse_option_is_one_line(capsys):
    assert main(["train", "--strategy", "topk", "--sparse", "memory=tiny"]) == 2
    err = capsys.readouterr().err
    assert "memory" in err and len(err.strip().splitlines()) == 1
