"""Built-in models: deterministic, learnable, sized as documented."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch.jobs.models import MODEL_NAMES, build_model  # noqa: E402


def _params(spec):
    return [p.detach().clone() for p in spec.module.parameters()]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_same_seed_same_parameters_and_data(name):
    a, b = build_model(name, seed=3), build_model(name, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b)))
    c = build_model(name, seed=4)
    assert not all(torch.equal(x, y) for x, y in zip(_params(a), _params(c)))
    xa, ya = a.make_batch(4, torch.Generator().manual_seed(1))
    xb, yb = b.make_batch(4, torch.Generator().manual_seed(1))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_mlp_learns_its_teacher():
    torch.manual_seed(0)
    spec = build_model("mlp")
    opt = torch.optim.Adam(spec.module.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        x, y = spec.make_batch(64, g)
        loss = spec.loss_fn(spec.module(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_vgg_size_is_communication_heavy():
    spec = build_model("vgg")
    numel = sum(p.numel() for p in spec.module.parameters())
    assert 10_000_000 <= numel <= 15_000_000
    x, y = spec.make_batch(2, torch.Generator().manual_seed(0))
    assert spec.module(x).shape == (2, 10) and y.shape == (2,)


def test_unknown_model_lists_known_names():
    with pytest.raises(GradschedError, match="known: mlp, cnn, vgg"):
        build_model("resnet9000")
    assert set(MODEL_NAMES) >= {"mlp", "cnn", "vgg", "gpt2", "bert"}


def test_transformers_models_or_clear_error():
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(GradschedError, match="pip install transformers"):
            build_model("gpt2")
        return
    for name in ("gpt2", "bert"):
        spec = build_model(name)
        x, y = spec.make_batch(2, torch.Generator().manual_seed(0))
        assert spec.loss_fn(spec.module(x), y).ndim == 0
