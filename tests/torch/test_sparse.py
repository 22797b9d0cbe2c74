"""Top-k with error feedback in the runtime: exactness, bookkeeping, resume, memory accounting.

Pure checks of the compressor run in this process; the distributed scenarios run in
one spawned 2-rank gloo job (each returns what the assertions below need).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from gradsched.errors import GradschedError, InternalError  # noqa: E402
from gradsched.plan import Operation, Plan, Slice  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from helpers import params_of, train  # noqa: E402
from gradsched.torch.runtime.memory import MemoryLedger, storage_bytes  # noqa: E402
from gradsched.torch.runtime.planning import profile_from_module  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.torch.runtime.sparse import SparseOptions, compress, k_of, topk_indices  # noqa: E402


# --------------------------------------------------------------------------- in-process
def test_compress_keeps_exactly_what_it_does_not_send():
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(10_000, generator=gen)
    original = c.clone()
    k = k_of(0.01, c.numel())
    idx, values = compress(c, k)
    assert k == 100 and idx.numel() == k == values.numel()
    assert torch.equal(values, original[idx])
    rebuilt = c.clone().index_put_((idx,), values)  # sent + residual
    assert torch.equal(rebuilt, original)
    assert torch.count_nonzero(c[idx]) == 0
    # the k sent are the k largest magnitudes
    assert original.abs()[idx].min() >= original.abs().topk(k).values.min()
    c2 = original.clone()
    compress(c2, k, error_feedback=False)
    assert torch.count_nonzero(c2) == 0


def test_sampled_threshold_selects_the_same_elements_as_topk():
    gen = torch.Generator().manual_seed(1)
    for n, density in ((200_000, 0.001), (100_000, 0.01), (50_000, 0.1)):
        x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen)
        k = k_of(density, n)
        a = set(topk_indices(x, k, "exact").tolist())
        b = set(topk_indices(x, k, "sampled").tolist())
        assert len(b) == k and a == b


def test_k_and_options_are_checked():
    assert k_of(0.001, 10) == 1 and k_of(1.0, 10) == 10 and k_of(0.5, 3) == 2
    with pytest.raises(GradschedError, match="selection"):
        SparseOptions.of({"selection": "random"})
    with pytest.raises(GradschedError, match="unknown sparse option"):
        SparseOptions.of({"density": 0.1})
    with pytest.raises(GradschedError, match="warmup_steps"):
        SparseOptions.of({"warmup_steps": -1})


def test_ledger_tracks_live_and_peak():
    led = MemoryLedger()
    a = led.alloc("a", torch.zeros(100))
    led.alloc("b", torch.zeros(50, dtype=torch.int32))
    assert led.live_bytes == 600 == storage_bytes(a) + 200
    led.free("b")
    led.transient(1000)
    assert led.live_bytes == 400 and led.peak_bytes == 1400
    with pytest.raises(InternalError):  # a fault of gradsched, not of the user's input
        led.free("b")


# --------------------------------------------------------------------------- distributed scenarios
def _topk_plan(module: torch.nn.Module, density: float, per_layer: bool = True) -> Plan:
    prof = profile_from_module(module)
    groups: dict[int, list[int]] = {}
    for i in prof.order:
        groups.setdefault(prof.layer_of[i] if per_layer else 0, []).append(i)
    ops = tuple(Operation(tuple(Slice(i, 0, prof.tensors[i].numel) for i in g), "topk-allgather", j, density)
                for j, g in enumerate(groups.values()))
    return Plan("hand-topk", ops, prof.fingerprint)


def _train(rank: int, world: int, plan, optimizer: str, steps: int, *, sparse=None, use_torch_ddp=False,
           seed: int = 0) -> list[torch.Tensor]:
    spec = build_model("mlp", seed=seed)
    model = DistributedDataParallel(spec.module, plan if not callable(plan) else plan(spec.module),
                                    use_torch_ddp=use_torch_ddp, sparse_options=sparse)
    inner = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
             else torch.optim.Adam(model.parameters(), lr=1e-2))
    opt = DistributedOptimizer(inner, model)
    train(model, opt, spec.make_batch, spec.loss_fn, rank=rank, world=world, steps=steps, seed=7)
    model.synchronize()
    return params_of(spec.module)


def _bookkeeping(rank: int, world: int, density: float) -> dict:
    """Two steps of plain SGD (lr 1): the update must be the average of what the ranks sent,
    and sent + residual must equal gradient + previous residual, element for element."""
    spec = build_model("mlp")
    local = copy.deepcopy(spec.module)  # computes this rank's own gradient, no communication
    model = DistributedDataParallel(spec.module, _topk_plan(spec.module, density))
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model)
    ex = model._executor
    gen = torch.Generator().manual_seed(3)
    residual = [torch.zeros(p.numel()) for p in local.parameters()]
    checks = []
    for _ in range(2):
        x, y = spec.make_batch(8 * world, gen)
        local.load_state_dict(spec.module.state_dict())
        local.zero_grad()
        spec.loss_fn(local(x[rank::world]), y[rank::world]).backward()
        before = [p.detach().clone() for p in spec.module.parameters()]
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
        new_res = {}
        for j, r in enumerate(ex.runners):
            flat = r.residual_tensor()
            for s in ex.layout.op_slots[j]:
                new_res[s.tensor] = flat[s.arena_start - ex.layout.op_pieces[j][0].start:][:s.end - s.start].clone()
        sent, exact, counts = [], True, []
        for i, p in enumerate(local.parameters()):
            compensated = p.grad.reshape(-1) + residual[i]
            s_i = compensated - new_res[i]
            nz = new_res[i] != 0
            exact &= bool(torch.equal(new_res[i][nz], compensated[nz]))  # residual is c where not sent
            sent.append(torch.where(nz, torch.zeros_like(s_i), compensated))
            counts.append(int(torch.count_nonzero(sent[-1])))
            residual[i] = new_res[i]
        every = [None] * world
        dist.all_gather_object(every, sent)
        avg = [sum(e[i] for e in every) / world for i in range(len(sent))]
        step = [b.reshape(-1) - p.detach().reshape(-1) for b, p in zip(before, spec.module.parameters())]
        checks.append({"exact": exact, "update_err": rel_diff(step, avg), "counts": counts,
                       "k": [k_of(density, sum(p.numel() for p in g)) for g in _layer_params(local)]})
    return {"checks": checks, "numels": [p.numel() for p in local.parameters()]}


def _layer_params(module: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    return [list(m.parameters(recurse=False)) for m in module.modules() if list(m.parameters(recurse=False))]


def _resume(rank: int, world: int, density: float, warmup: int) -> dict:
    """6 steps, save model + optimizer (residuals inside), 4 more; a fresh model loads and does the 4."""
    sparse = {"warmup_steps": warmup}

    def make(seed):
        spec = build_model("mlp", seed=seed)
        model = DistributedDataParallel(spec.module, _topk_plan(spec.module, density), sparse_options=sparse)
        return spec, model, DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model)

    def steps(spec, model, opt, gen, n):
        for _ in range(n):
            x, y = spec.make_batch(8 * world, gen)
            opt.zero_grad()
            spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
            opt.step()

    spec, model, opt = make(0)
    gen = torch.Generator().manual_seed(5)
    steps(spec, model, opt, gen, 6)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())
    gen_state = gen.get_state()
    steps(spec, model, opt, gen, 4)
    straight = [p.detach().clone() for p in model.parameters()]
    _, model2, opt2 = make(123)
    model2.load_state_dict(saved)
    opt2.load_state_dict(saved_opt)
    gen.set_state(gen_state)
    steps(spec, model2, opt2, gen, 4)
    resumed = [p.detach().clone() for p in model2.parameters()]
    # without the residuals (strict=False, dense-style checkpoint) the run differs: they matter
    _, model3, opt3 = make(123)
    model3.load_state_dict({k: v for k, v in saved.items() if k.startswith("module.")}, strict=False)
    opt3.load_state_dict(saved_opt)
    gen.set_state(gen_state)
    steps(spec, model3, opt3, gen, 4)
    no_res = [p.detach().clone() for p in model3.parameters()]
    return {"straight": straight, "resumed": resumed, "no_residual": no_res, "keys": sorted(saved)}


def _memory(rank: int, world: int, mode: str | None, density: float) -> dict:
    """Ledger vs the storage of the buffers the executor holds: at rest, and mid-backward (ops in flight)."""
    spec = build_model("mlp")
    plan = "wfbp" if mode is None else _topk_plan(spec.module, density)
    model = DistributedDataParallel(spec.module, plan, sparse_options={"memory": mode} if mode else None)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
    ex = model._executor
    samples = []

    def sample():
        held = ex.held_buffers()
        storages = {t.untyped_storage().data_ptr(): storage_bytes(t) for t in held.values()}
        samples.append((ex.ledger.live_bytes, sum(storages.values()), sorted(held) == sorted(ex.ledger.snapshot())))

    first = next(iter(spec.module.parameters()))  # the input layer: ready last, others in flight
    first.register_post_accumulate_grad_hook(lambda _p: sample())
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = spec.make_batch(8, gen)
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
        sample()
    params_bytes = sum(storage_bytes(p) for p in spec.module.parameters())
    largest = max(storage_bytes(p) for p in spec.module.parameters())
    return {"samples": samples, "stats": model.memory_stats(), "params_bytes": params_bytes, "largest": largest,
            "grads_none": [p.grad is None for p in spec.module.parameters()]}


def scenarios(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    out: dict = {}
    for opt in ("sgd", "adam"):
        out[f"ref/{opt}"] = _train(rank, world, "ddp", opt, 6, use_torch_ddp=True)
        out[f"d1/{opt}"] = _train(rank, world, lambda m: _topk_plan(m, 1.0), opt, 6)
        out[f"d1-naive/{opt}"] = _train(rank, world, lambda m: _topk_plan(m, 1.0), opt, 6, sparse={"memory": "naive"})
        out[f"d1-merged-sampled/{opt}"] = _train(rank, world, lambda m: _topk_plan(m, 1.0, per_layer=False), opt, 6,
                                                 sparse={"selection": "sampled"})
    out["topk-strategy"] = _train(rank, world, "topk", "sgd", 3)
    out["omgs-strategy"] = _train(rank, world, "omgs", "sgd", 3)
    out["sparse-laysa"] = _train(rank, world, lambda m: _topk_plan(m, 0.05), "adam", 6)
    out["sparse-naive"] = _train(rank, world, lambda m: _topk_plan(m, 0.05), "adam", 6, sparse={"memory": "naive"})
    out["warm-dense"] = _train(rank, world, "ddp", "adam", 2, use_torch_ddp=True)
    out["warm-sparse"] = _train(rank, world, lambda m: _topk_plan(m, 0.05), "adam", 2, sparse={"warmup_steps": 2})
    out["bookkeeping"] = _bookkeeping(rank, world, 0.05)
    out["resume"] = _resume(rank, world, 0.05, warmup=0)
    out["resume-warm"] = _resume(rank, world, 0.05, warmup=8)
    for mode in (None, "laysa", "naive"):
        out[f"memory/{mode}"] = _memory(rank, world, mode, 0.01)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def results():
    return spawn_local(scenarios, 2, timeout_s=90)


# --------------------------------------------------------------------------- assertions
@pytest.mark.slow
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("case", ["d1", "d1-naive", "d1-merged-sampled"])
def test_density_one_equals_dense(results, case, opt):
    for r in results:
        assert rel_diff(r[f"{case}/{opt}"], r[f"ref/{opt}"]) <= 1e-6
    assert rel_diff(results[0][f"{case}/{opt}"], results[1][f"{case}/{opt}"]) == 0.0


@pytest.mark.slow
def test_sparse_runs_identically_on_every_rank_and_differs_from_dense(results):
    for key in ("topk-strategy", "omgs-strategy", "sparse-laysa", "sparse-naive"):
        assert rel_diff(results[0][key], results[1][key]) == 0.0
    # LaySA and the naive layout compute the same numbers
    assert rel_diff(results[0]["sparse-laysa"], results[0]["sparse-naive"]) == 0.0
    assert rel_diff(results[0]["sparse-laysa"], results[0]["d1/adam"]) > 1e-3  # density 0.05 is not dense


@pytest.mark.slow
def test_dense_warmup_steps_equal_dense_training(results):
    assert rel_diff(results[0]["warm-sparse"], results[0]["warm-dense"]) <= 1e-6


@pytest.mark.slow
def test_residual_bookkeeping_is_exact(results):
    for r in results:
        for c in r["bookkeeping"]["checks"]:
            assert c["exact"]
            assert c["update_err"] <= 1e-6  # the update is the average of what every rank sent
        # each rank sent k per layer (counted per tensor; a sent value can be exactly zero only by chance)
        first = r["bookkeeping"]["checks"][0]
        assert sum(first["counts"]) == sum(first["k"])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["resume", "resume-warm"])
def test_save_and_resume_continue_bit_for_bit(results, case):
    for r in results:
        c = r[case]
        assert all(torch.equal(a, b) for a, b in zip(c["straight"], c["resumed"]))
        assert any(k.startswith("_gradsched_sparse.residual") for k in c["keys"])
    if case == "resume":
        assert rel_diff(results[0][case]["no_residual"], results[0][case]["straight"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["None", "laysa", "naive"])
def test_memory_ledger_matches_allocated_buffers(results, mode):
    for r in results:
        m = r[f"memory/{mode}"]
        assert len(m["samples"]) == 6
        for live, actual, same_names in m["samples"]:
            assert same_names and live == actual
        assert m["stats"]["peak_bytes"] >= max(s[0] for s in m["samples"])


@pytest.mark.slow
def test_laysa_memory_beats_naive_and_stays_near_dense(results):
    m = {mode: results[0][f"memory/{mode}"] for mode in ("None", "laysa", "naive")}
    dense, laysa, naive = (m[k]["stats"]["peak_bytes"] for k in ("None", "laysa", "naive"))
    params = m["None"]["params_bytes"]
    assert naive >= 2 * params  # gradient buffer + residual + wire buffers
    assert laysa <= 1.3 * dense < naive
    assert all(m["laysa"]["grads_none"])  # dense gradients released after the mirror update


def test_selection_benchmark_fits_n_log_n():
    from gradsched.cluster import Cluster
    from gradsched.torch.runtime.sparse import benchmark_selection

    c, points = benchmark_selection("cpu", "sampled", sizes=(1_000, 20_000), repeats=1)
    assert [n for n, _ in points] == [1_000, 20_000] and all(t > 0 for _, t in points)
    assert 0 < c < 1e-6  # seconds per n log2 n: nanoseconds at most on any CPU
    cluster = Cluster.alpha_beta(1e-4, 1e-9, 2)
    cluster.extra["topk_selection_s_per_nlogn"] = c
    assert cluster.selection_s(1024) == pytest.approx(c * 1024 * 10)
