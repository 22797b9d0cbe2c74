"""``omgs``: OMGS-SGD's merged gradient sparsification (Shi et al., INFOCOM 2020).

Layer-wise top-k (``topk``) pays a selection and an all-gather start-up per layer;
one top-k over the whole model overlaps nothing.  OMGS-SGD sweeps the layers in
backward order and merges the open group into the next layer when that costs less
waiting than it saves:

- wait: ``tw = tb[next] + ts(n_G + n_next) - ts(n_G) - ts(n_next) - slack_G``: the
  group's top-k now runs after the next layer's backward, on a longer vector, but
  its all-gather would have waited ``slack_G`` for the channel anyway;
- saving: ``tag(k_G) + tag(k_next) - tag(k_merged)``, about one start-up.

Merge when ``tw < saving``.  The timeline is the simulator's: backward and top-k
selections share the compute stream (a group's selection runs right after the
layer that completes it, delaying later layers), and a group's all-gather starts
when its selection is done and the channel is free.  ``ts`` is the cluster's
``selection_s``; ``tag`` its all-gather of ``k`` values and ``k`` int32 indices per
rank, ``k = ceil(density * numel)``.  A layer's tensors always stay together, and
each group becomes one operation per element size (the runtime's operations hold one
dtype: :func:`~gradsched.planners.topk.split_by_element_size`), the split plans being
what the refinement below simulates.

The rule is a greedy heuristic and can lose to layer-wise ``topk`` (each decision
sees only the open group and the next layer) or to one top-k over the whole model.
So by default (``refine_plan=True``) the plan is then improved on the simulator's exact
sparse timeline: start from the best of the OMGS groups, one group per layer and
one group for everything, and toggle each layer boundary (merge two groups or split
one) while the predicted iteration time drops.  A simulation costs time in
proportion to the number of layers, so the search gets a fixed amount of work,
``REFINE_WORK`` layer-simulations (at least the three starting points): a 16-layer
VGG gets hundreds of simulations, a 1,000-tensor model a handful, and planning stays
within tens of milliseconds.  The budget is a count, not a clock, so every rank that
plans the same profile gets the same plan.  The result is never predicted slower than any of the three.
``refine_plan=False`` gives the paper's rule alone.

What the rule groups (``per_tensor``, as ``topk``'s): the profile's layers, or each
tensor on its own as in the authors' code (a selection costs more than linearly in its
length, so selecting a layer's tensors separately can be cheaper).  Left out, the plan
is made at both granularities and the one with the shorter simulated iteration kept
(ties: layers), so it is never predicted slower than the authors' granularity.
"""

from __future__ import annotations

from dataclasses import replace

from gradsched.cluster import Cluster
from gradsched.plan import Plan, whole_slices
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.planners.topk import DEFAULT_DENSITY, PER_TENSOR, choose_granularity, sparse_ops, units_in_ready_order
from gradsched.profile import Profile
from gradsched.sparsity import DENSITY, sent_bytes

REFINE_WORK = 2000  # layer-simulations the local search may spend (see the module docstring)


def merge_layers(profile: Profile, cluster: Cluster, density: float, per_tensor: bool = False) -> list[list[int]]:
    """OMGS-SGD's groups of tensor indices, in ready order (see the module docstring)."""
    return sweep(profile, cluster, density, per_tensor)[0]


def sweep(profile: Profile, cluster: Cluster, density: float,
          per_tensor: bool = False) -> tuple[list[list[int]], list[float]]:
    """The groups and the modelled end of each group's all-gather (s after backward starts), each
    group one all-gather as in the paper (before :func:`~gradsched.planners.topk.split_by_element_size`);
    ``per_tensor``: the units merged are the tensors, not the layers."""
    gather = cluster.cost("allgather")
    layers = units_in_ready_order(profile, per_tensor)
    tensors = profile.tensors
    numel = [sum(tensors[i].numel for i in g) for g in layers]
    backward_s = [sum(tensors[i].backward_s for i in g) for g in layers]

    def tag(n: int, first_tensor: int) -> float:
        return gather.time_s(sent_bytes(density, n, tensors[first_tensor].element_bytes))

    ts = cluster.selection_s
    groups: list[list[int]] = []
    ends_s: list[float] = []
    group = list(layers[0])
    n_group = numel[0]
    compute_s = backward_s[0]  # compute stream clock: the open group's last backward has ended
    channel_free_s = 0.0
    for u in range(1, len(layers)):
        select_end_s = compute_s + ts(n_group)
        slack_s = max(0.0, channel_free_s - select_end_s)
        wait_s = backward_s[u] + ts(n_group + numel[u]) - ts(n_group) - ts(numel[u]) - slack_s
        saving_s = tag(n_group, group[0]) + tag(numel[u], layers[u][0]) - tag(n_group + numel[u], group[0])
        if wait_s < saving_s:
            group.extend(layers[u])
            n_group += numel[u]
        else:
            groups.append(group)
            channel_free_s = select_end_s + slack_s + tag(n_group, group[0])
            ends_s.append(channel_free_s)
            compute_s = select_end_s
            group, n_group = list(layers[u]), numel[u]
        compute_s += backward_s[u]
    groups.append(group)
    select_end_s = compute_s + ts(n_group)
    ends_s.append(max(select_end_s, channel_free_s) + tag(n_group, group[0]))
    return groups, ends_s


def refine(groups: list[list[int]], profile: Profile, cluster: Cluster, density: float,
           max_simulations: int | None = None, per_tensor: bool = False) -> list[list[int]]:
    """Local search over layer boundaries on the simulated iteration time (module docstring)."""
    return refine_timed(groups, profile, cluster, density, max_simulations, per_tensor)[0]


def refine_timed(groups: list[list[int]], profile: Profile, cluster: Cluster, density: float,
                 max_simulations: int | None = None,
                 per_tensor: bool = False) -> tuple[list[list[int]], float | None]:
    """:func:`refine`, and the refined groups' simulated iteration (None where nothing was simulated)."""
    from gradsched.sim import simulate

    layers = units_in_ready_order(profile, per_tensor)
    if len(layers) < 2:
        return groups, None
    if max_simulations is None:
        max_simulations = 3 + REFINE_WORK // len(layers)
    group_of_tensor: dict[int, int] = {}
    for g, tensors in enumerate(groups):
        for t in tensors:
            group_of_tensor[t] = g

    def groups_of(cuts: list[bool]) -> list[list[int]]:
        out = [list(layers[0])]
        for u in range(1, len(layers)):
            if cuts[u - 1]:
                out.append([])
            out[-1].extend(layers[u])
        return out

    evaluations = 0
    whole = whole_slices(profile)  # made once: every plan tried uses them

    def cost(cuts: list[bool]) -> float:
        nonlocal evaluations
        evaluations += 1
        ops = sparse_ops(groups_of(cuts), profile, density, whole)
        return simulate(Plan("omgs", ops, profile.fingerprint, profile.model), profile, cluster,
                        timeline=False).iteration_s

    sweep_cuts = [group_of_tensor[layers[u][0]] != group_of_tensor[layers[u - 1][0]] for u in range(1, len(layers))]
    starts = [sweep_cuts, [True] * (len(layers) - 1), [False] * (len(layers) - 1)]
    scored = [(cost(c), k, c) for k, c in enumerate(starts)]  # ties: the paper's rule first
    best_s, _, cuts = min(scored)
    cuts = list(cuts)
    improved = True
    while improved and evaluations < max_simulations:
        improved = False
        for u in range(len(cuts)):
            if evaluations >= max_simulations:
                break
            cuts[u] = not cuts[u]
            tried_s = cost(cuts)
            if tried_s < best_s * (1 - 1e-9):
                best_s, improved = tried_s, True
            else:
                cuts[u] = not cuts[u]
    return groups_of(cuts), best_s


OPTIONS = (
    replace(DENSITY, default=DEFAULT_DENSITY),
    Option("refine_plan", bool, True, doc="improve the paper's groups on the simulator's timeline"),
    PER_TENSOR,
)


@register("omgs", sparse=True, options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, density: float = DEFAULT_DENSITY, refine_plan: bool = True,
         per_tensor: bool | None = None) -> Plan:
    d = density

    def build(choice: bool) -> tuple[Plan, float | None]:
        groups, t = merge_layers(profile, cluster, d, choice), None
        if refine_plan:
            groups, t = refine_timed(groups, profile, cluster, d, per_tensor=choice)
        options = {"density": d, "refine_plan": bool(refine_plan), "per_tensor": choice}
        return Plan("omgs", sparse_ops(groups, profile, d), profile.fingerprint, profile.model, options), t

    return choose_granularity(build, profile, cluster, per_tensor)
