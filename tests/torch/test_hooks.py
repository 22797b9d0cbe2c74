"""DDP communication hooks (gradsched.torch.runtime.hooks): error feedback, checkpointed state, training on 2 ranks."""

from __future__ import annotations

import io
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as TorchDDP  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.integrations import hooks as H  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402


# --------------------------------------------------------------------------- no processes
def test_error_feedback_loses_nothing():
    """Over many steps, everything sent plus the residual left equals the sum of the gradients."""
    gen = torch.Generator().manual_seed(0)
    state = H.TopKState(density=0.05)
    grads_total = torch.zeros(1000, dtype=torch.float64)
    sent_total = torch.zeros(1000, dtype=torch.float64)
    for _ in range(30):
        g = torch.randn(1000, generator=gen, dtype=torch.float64)
        grads_total += g
        values, indices = state.compress(3, g)
        assert values.numel() == 50
        sent_total.index_add_(0, indices, values)
    assert torch.allclose(sent_total + state.residuals[3], grads_total, atol=1e-10)
    assert state.sent_elements == 30 * 50 and state.dense_elements == 30 * 1000


def test_without_error_feedback_something_is_lost():
    """The check above can fail: without error feedback the unsent part is gone."""
    gen = torch.Generator().manual_seed(0)
    state = H.TopKState(density=0.05, error_feedback=False)
    total, sent = torch.zeros(1000, dtype=torch.float64), torch.zeros(1000, dtype=torch.float64)
    for _ in range(5):
        g = torch.randn(1000, generator=gen, dtype=torch.float64)
        total += g
        v, i = state.compress(0, g)
        sent.index_add_(0, i, v)
    assert not state.residuals and (sent - total).abs().max() > 0.5


def test_compress_takes_largest_magnitudes():
    state = H.TopKState(density=0.25)
    v, i = state.compress(0, torch.tensor([0.1, -5.0, 0.2, 3.0, 0.0, -0.3, 0.05, 1.0]))
    assert sorted(i.tolist()) == [1, 3]
    assert sorted(v.tolist()) == [-5.0, 3.0]
    assert torch.equal(state.residuals[0], torch.tensor([0.1, 0.0, 0.2, 0.0, 0.0, -0.3, 0.05, 1.0]))


def test_state_round_trips_without_the_process_group():
    state = H.TopKState(object(), density=0.1, warmup_steps=3, merge_bytes=1024)  # a stand-in group
    state.compress(0, torch.arange(20.0))
    state.iteration = 7
    for dump, load in ((pickle.dumps, pickle.loads), (_torch_dumps, _torch_loads)):
        back = load(dump(state))
        assert back.process_group is None
        assert (back.density, back.warmup_steps, back.merge_bytes, back.iteration) == (0.1, 3, 1024.0, 7)
        assert torch.equal(back.residuals[0], state.residuals[0])
        assert back.sent_elements == state.sent_elements


def test_state_rejects_bad_settings_and_foreign_checkpoints():
    for kw in ({"density": 0.0}, {"density": 1.5}, {"warmup_steps": 0}, {"merge_bytes": 0}):
        with pytest.raises(GradschedError):
            H.TopKState(**kw)
    with pytest.raises(GradschedError, match="not a TopKState checkpoint"):
        H.TopKState().__setstate__({"density": 0.1})
    state = H.TopKState(density=0.5)
    state.compress(0, torch.zeros(10))
    with pytest.raises(GradschedError, match="another model or bucket_cap_mb"):
        state.compress(0, torch.zeros(12))


def _torch_dumps(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _torch_loads(data):
    return torch.load(io.BytesIO(data), weights_only=False)


# --------------------------------------------------------------------------- 2 ranks
HOOKS = {
    "none": (None, None),
    "allreduce": (None, H.allreduce_hook),
    "fp16": (None, H.fp16_hook),
    "bf16": (None, H.bf16_hook),
    "topk": ("topk", H.topk_hook),
    "merged": ("merged", H.merged_topk_hook),
    "fp16+topk": ("topk", H.fp16_wrapper(H.topk_hook)),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def _train_with_hooks(rank: int, world: int, names: list[str], steps: int) -> dict:
    """Train the same model under each hook; return final parameters, losses and state facts."""
    out = {}
    for name in names:
        kind, hook = HOOKS[name]
        module = _model()
        # a small bucket cap: several buckets, so merging and per-bucket residuals are exercised
        ddp = TorchDDP(module, bucket_cap_mb=0.005)
        state = None
        if kind == "topk":
            state = H.TopKState(density=0.1, warmup_steps=2)
        elif kind == "merged":
            state = H.TopKState(density=0.1, warmup_steps=2, merge_bytes=float("inf"))
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(1)
        w_true = torch.randn(16, 1, generator=gen)
        losses = []
        for _ in range(steps):
            x = torch.randn(16 * world, 16, generator=gen)
            y = x @ w_true
            x, y = x[rank::world], y[rank::world]
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        facts = {}
        if state is not None:
            facts = {"buckets_with_residual": sorted(state.residuals), "iteration": state.iteration,
                     "sent": state.sent_elements, "dense": state.dense_elements,
                     "pickled": pickle.loads(pickle.dumps(state)).iteration}
        out[name] = {"params": [p.detach().clone() for p in module.parameters()], "losses": losses, **facts}
    return out


@pytest.mark.slow
def test_hooks_train_on_two_ranks():
    names = list(HOOKS)
    steps = 40
    ranks = spawn_local(_train_with_hooks, 2, names, steps, timeout_s=120)
    ref = ranks[0]["none"]["params"]
    for name in names:
        mine, theirs = ranks[0][name], ranks[1][name]
        assert all(torch.equal(a, b) for a, b in zip(mine["params"], theirs["params"])), name  # ranks agree
        first, last = sum(mine["losses"][:5]) / 5, sum(mine["losses"][-5:]) / 5
        assert last < 0.5 * first, (name, first, last)  # it trains
    assert rel_diff(ranks[0]["allreduce"]["params"], ref) < 1e-6
    fp16 = rel_diff(ranks[0]["fp16"]["params"], ref)
    bf16 = rel_diff(ranks[0]["bf16"]["params"], ref)
    topk = rel_diff(ranks[0]["topk"]["params"], ref)
    # close to plain DDP after 40 steps (bf16 keeps 8 bits of mantissa: 0.11 measured, fp16 0.003)
    assert fp16 < 1e-2 and bf16 < 0.25, (fp16, bf16)
    assert topk > fp16  # and sparsification is really on: further away than fp16
    top, merged = ranks[0]["topk"], ranks[0]["merged"]
    assert top["iteration"] == steps == merged["iteration"] == top["pickled"]
    assert len(top["buckets_with_residual"]) > 1  # one residual per bucket
    assert len(merged["buckets_with_residual"]) == 1  # one merged group over all buckets
    assert top["sent"] <= 0.1 * top["dense"] + len(top["buckets_with_residual"]) * (steps - 2)


def test_public_import_path():
    """The documented spelling, ``gradsched.torch.hooks``, imports the same module."""
    from gradsched.torch.hooks import fp16_hook, topk_hook

    assert fp16_hook is H.fp16_hook and topk_hook is H.topk_hook


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.sampled_from([0.001, 0.015, 0.07, 1 / 3, 1.0]), st.floats(min_value=1e-4, max_value=1.0)),
       st.integers(min_value=1, max_value=5000))
def test_hooks_send_the_k_that_planners_simulator_and_runtime_use(density, numel):
    """One ``k`` (gradsched.sparsity.k_of, rounded up) in the hooks as in the runtime's operations
    (the hooks rounded down before: 0.015 of 100 elements sent 1, the plan's 2)."""
    from gradsched.sparsity import k_of
    from gradsched.torch.runtime import sparse

    assert sparse.k_of is k_of
    values, indices = H.TopKState(density=density).compress(0, torch.randn(numel))
    assert values.numel() == indices.numel() == k_of(density, numel)


def test_hooks_select_through_the_runtimes_chunked_selection(monkeypatch):
    """Temporaries bounded by the selection's piece, not by the bucket: the hooks call topk_indices."""
    seen = []

    def spy(x, k, *args, **kwargs):
        seen.append((x.numel(), k))
        return sparse_topk(x, k, *args, **kwargs)

    from gradsched.torch.runtime.sparse import topk_indices as sparse_topk
    monkeypatch.setattr(H, "topk_indices", spy)
    g = torch.randn(3000, generator=torch.Generator().manual_seed(2))
    values, indices = H.TopKState(density=0.01).compress(0, g)
    assert seen == [(3000, 30)]
    assert set(indices.tolist()) == set(g.abs().topk(30).indices.tolist())


def test_hook_state_and_sparse_options_are_checked_by_their_option_declarations():
    """TopKState and SparseOptions check through gradsched.options: one-line errors, the declared defaults."""
    from gradsched.torch.runtime.sparse import OPTIONS, SparseOptions

    assert SparseOptions().to_dict() == {o.name: o.default for o in OPTIONS}
    state = H.TopKState()
    assert {o.name: getattr(state, o.name) for o in H.TOPK_OPTIONS} == {o.name: o.default for o in H.TOPK_OPTIONS}
    assert H.TopKState(merge_bytes=float("inf")).merge_bytes == float("inf")  # one top-k over the whole model
    for kw, words in (({"merge_bytes": float("nan")}, "merge_bytes must be a number, not NaN"),
                      ({"density": "x"}, "density must be a number"),
                      ({"warmup_steps": 0}, "DDP rebuilds its buckets"),
                      ({"colour": 1}, "unexpected keyword")):
        with pytest.raises((GradschedError, TypeError), match=words) as err:
            H.TopKState(**kw)
        assert "\n" not in str(err.value)
