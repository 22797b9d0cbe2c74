"""Issue 18 item 2: ``--model MODULE:FUNCTION`` in ``profile``, ``train`` and ``bench``.

The factories are defined in this module and named by its import name, as a user
names theirs; every way of getting it wrong is exit 2 with one line saying what is
missing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from gradsched.cli import main

HERE = Path(__file__).resolve().parent
FACTORY = f"{__name__}:build"


def build(seed):
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return module, _batch


def _batch(batch_size, generator):
    x = torch.randn(batch_size, 8, generator=generator)
    return x, (x.sum(1) > 0).long()


def build_regression():  # no seed argument, a loss of its own
    return nn.Linear(4, 1), lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), \
        nn.functional.l1_loss


def returns_module_only(seed):
    return nn.Linear(2, 2)


def returns_no_module(seed):
    return "linear", _batch


def batch_of_one_tensor(seed):
    return nn.Linear(8, 3), lambda n, g: torch.randn(n, 8, generator=g)


def raises(seed):
    raise ValueError("no data at /nowhere")


def takes_two(seed, width):
    return build(seed)


def batch_of_one_argument(seed):
    return nn.Linear(8, 3), lambda n: (torch.randn(n, 8), torch.zeros(n, dtype=torch.long))


def batch_that_raises(seed):
    def batch(n, g):
        raise KeyError("shard 7")
    return nn.Linear(8, 3), batch


class _FailsAtStep3(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.calls = nn.Linear(8, 3), 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("bad shape in my layer")
        return self.linear(x)


def fails_at_step_3(seed):
    return _FailsAtStep3(), _batch


NOT_A_FUNCTION = 3


@pytest.fixture
def importable(monkeypatch):
    """This module importable by name in this process and in the workers it starts."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))


def test_profile_a_factory(tmp_path, importable, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--model", FACTORY, "--iterations", "2", "--warmup", "1", "-q", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == FACTORY
    assert [t["numel"] for t in data["tensors"]] == [128, 16, 48, 3]


def test_factory_without_seed_and_with_its_own_loss(importable):
    from gradsched.torch.jobs.models import build_model

    spec = build_model(f"{__name__}:build_regression", seed=1)
    x, y = spec.make_batch(4, torch.Generator().manual_seed(0))
    assert spec.loss_fn is nn.functional.l1_loss and spec.module(x).shape == y.shape


def test_same_seed_same_parameters(importable):
    from gradsched.torch.jobs.models import build_model

    a, b = build_model(FACTORY, seed=3).module, build_model(FACTORY, seed=3).module
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("command", [["profile", "-q", "-o", "/dev/null"], ["train"], ["bench", "--loopback"]])
@pytest.mark.parametrize("model,words", [
    ("nomodule_xyz:build", ["cannot import module 'nomodule_xyz'", "PYTHONPATH"]),
    (f"{__name__}:nope", ["has no attribute 'nope'"]),
    (f"{__name__}:NOT_A_FUNCTION", ["not a function"]),
    (f"{__name__}:returns_module_only", ["returned a Linear", "(module, batch_fn)"]),
    (f"{__name__}:returns_no_module", ["first value is a str", "torch.nn.Module"]),
    (f"{__name__}:batch_of_one_tensor", ["batch function returned a Tensor", "(inputs, targets)"]),
    (f"{__name__}:", ["MODULE:FUNCTION"]),
    (f"{__name__}:raises", ["the factory raised ValueError at test_model_factory.py:", "no data at /nowhere"]),
    (f"{__name__}:takes_two", ["the factory takes (seed, width)", "factory(seed)"]),
    (f"{__name__}:batch_of_one_argument", ["the batch function takes arguments (n)", "batch_fn(batch_size, generator)"]),
    (f"{__name__}:batch_that_raises", ["the batch function raised KeyError", "shard 7"]),
])
def test_factory_errors_say_what_is_missing(importable, capsys, command, model, words):
    assert main([command[0], "--model", model, *command[1:]]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.slow
def test_train_a_factory_on_two_workers(importable, capsys):
    code = main(["train", "--model", FACTORY, "--workers", "2", "--steps", "4", "--warmup", "1",
                 "--strategy", "mgwfbp", "--json", "-"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out)
    assert result["model"] == FACTORY and result["params"] == 8 * 16 + 16 + 16 * 3 + 3
    assert len(result["losses"]) == 4


@pytest.mark.slow
def test_a_worker_that_fails_shows_its_own_error_and_rank_and_progress_streams(importable, capsys):
    """Issue 38 item 2: the failing rank's own error (its traceback's last lines, the rank named), not the
    launcher's ChildFailedError; progress lines on stderr while training."""
    code = main(["train", "--model", f"{__name__}:fails_at_step_3", "--workers", "2", "--steps", "5"])
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert "training failed on rank " in last and "RuntimeError: bad shape in my layer" in last, err
    assert "ChildFailedError" not in err
    assert "in forward" in err and "failed; the last lines of its traceback:" in err
    assert "step 1/5, loss " in err  # the first step's progress line came before the failure
