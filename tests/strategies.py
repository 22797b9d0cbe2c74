"""Hypothesis strategies for random profiles and clusters, shared by the planner tests.

Sizes and times span the regimes the planners must handle: start-up-bound (tiny
tensors, large ``alpha``), bandwidth-bound (large tensors) and compute-bound (long
backward layers).  Layers own one or two tensors (weight and bias: the bias has
zero times and joins the layer before it), and a profile may list a ready order
that is not the reverse forward order (layers reordered, tensors of a layer kept
together, as hooks report for shared modules).
"""

from __future__ import annotations

from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile

MS = 1e-3


@st.composite
def profiles(draw: st.DrawFn, min_layers: int = 1, max_layers: int = 8, *, mixed_dtypes: bool = False,
             with_update: bool = False, shuffled: bool = True, max_numel: int = 4_000_000) -> Profile:
    """A random profile of ``min_layers..max_layers`` layers (each 1 or 2 tensors).

    ``mixed_dtypes``: some tensors are 2-byte (bf16/fp16) instead of 4-byte.
    ``with_update``: tensors get a non-zero optimizer ``update_s``.
    ``shuffled``: the ready order may permute the layers."""
    n_layers = draw(st.integers(min_layers, max_layers))
    times = st.floats(0.0, 5 * MS, allow_nan=False, allow_infinity=False)
    tensors: list[TensorProfile] = []
    layer_tensors: list[list[int]] = []
    for layer in range(n_layers):
        members = []
        for part in range(draw(st.integers(1, 2))):
            numel = draw(st.integers(1, max_numel))
            elem = draw(st.sampled_from([4, 2])) if mixed_dtypes else 4
            upd = draw(st.floats(0.0, 0.5 * MS)) if with_update else 0.0
            fwd, bwd = (draw(times), draw(times)) if part == 0 else (0.0, 0.0)
            members.append(len(tensors))
            tensors.append(TensorProfile(f"l{layer}.t{part}", numel, numel * elem, fwd, bwd, layer, upd))
        layer_tensors.append(members)
    backward_layers = list(range(n_layers - 1, -1, -1))
    if shuffled and draw(st.booleans()):
        backward_layers = draw(st.permutations(backward_layers))
    order = tuple(i for layer in backward_layers for i in layer_tensors[layer])
    other_s = draw(st.sampled_from([0.0, 2 * MS, 20 * MS]))
    return Profile("random", tuple(tensors), order, other_s)


@st.composite
def clusters(draw: st.DrawFn, *, zero_alpha: bool = False, tables: bool = True) -> Cluster:
    """A random cluster: an alpha-beta line, sometimes with a measured (piecewise) table.

    ``zero_alpha``: no start-up cost (then merging can never help).
    ``tables``: allow a monotone measured table for the all-reduce."""
    world = draw(st.sampled_from([2, 4, 8, 16]))
    alpha_s = 0.0 if zero_alpha else draw(st.floats(1e-6, 5 * MS))
    beta_s_per_byte = draw(st.floats(1e-11, 1e-8))
    ar = CollectiveCost(alpha_s, beta_s_per_byte)
    if tables and not zero_alpha and draw(st.booleans()):
        # A protocol switch: small messages cheaper than the line, a jump in the middle.
        sizes = sorted(set(draw(st.lists(st.integers(1 << 10, 64 << 20), min_size=2, max_size=6))))
        if len(sizes) >= 2:
            jump = draw(st.floats(0.5, 2.0))
            points, level = [], 0.0
            for k, s in enumerate(sizes):
                t = alpha_s * (jump if k >= len(sizes) // 2 else 1.0) + beta_s_per_byte * s
                level = max(level, t)  # keep the table monotone
                points.append((float(s), level))
            ar = CollectiveCost(alpha_s, beta_s_per_byte, tuple(points))
    extra = {"topk_selection_s_per_nlogn": draw(st.sampled_from([2.19e-10, 2e-11, 0.0]))}
    return Cluster(world, {"allreduce": ar}, extra=extra)


@st.composite
def profile_and_cluster(draw: st.DrawFn, **profile_kw) -> tuple[Profile, Cluster]:
    return draw(profiles(**profile_kw)), draw(clusters())


@st.composite
def two_level_clusters(draw: st.DrawFn) -> Cluster:
    """A random two-level cluster (nodes x ranks per node): per-link latency and inverse bandwidth
    inside a node and between nodes, read as ring lines, sometimes a measured table between nodes."""
    nodes = draw(st.sampled_from([2, 4, 16, 128]))
    m = draw(st.sampled_from([1, 2, 4, 8]))
    a_i, a_e = draw(st.floats(1e-7, 0.2 * MS)), draw(st.floats(1e-6, 2 * MS))
    b_i, b_e = draw(st.floats(1e-12, 1e-9)), draw(st.floats(1e-11, 1e-8))
    intra = CollectiveCost(2 * (m - 1) * a_i, 2 * (m - 1) / m * b_i) if m > 1 else None
    alpha, beta = 2 * (nodes - 1) * a_e, 2 * (nodes - 1) / nodes * b_e
    inter = CollectiveCost(alpha, beta)
    if draw(st.booleans()):
        sizes = sorted(set(draw(st.lists(st.integers(1 << 10, 64 << 20), min_size=2, max_size=5))))
        if len(sizes) >= 2:
            points, level = [], 0.0
            for k, s in enumerate(sizes):
                level = max(level, alpha * (1.5 if k >= len(sizes) // 2 else 0.7) + beta * s)
                points.append((float(s), level))
            inter = CollectiveCost(alpha, beta, tuple(points))
    algorithm = draw(st.sampled_from(["ring", "hierarchical", "tree"]))
    return Cluster.two_level(intra, inter, nodes, m, algorithm=algorithm)
