"""``topk``: layer-wise top-k sparsification, one top-k all-gather per layer.

Each layer's gradients (all its tensors together) go as one ``topk-allgather``
operation that sends the ``k = ceil(density * numel)`` largest-magnitude entries
with their int32 indices; what is not sent stays in a residual for the next
iteration (error feedback, in the runtime).  Layer-wise top-k pipelines well with
backward but pays a start-up and a selection per layer: ``omgs`` merges layers
where that pays.  The default density 0.001 is OMGS-SGD's.
"""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import SPARSE, Plan, whole_tensor_ops
from gradsched.planners.registry import register
from gradsched.profile import Profile

DEFAULT_DENSITY = 0.001


def check_density(strategy: str, density: float) -> float:
    """``density`` as a float in (0, 1], or a GradschedError that says what to pass."""
    try:
        d = float(density)
    except (TypeError, ValueError):
        raise GradschedError(f"{strategy}: density must be a number in (0, 1], got {density!r}") from None
    if not 0 < d <= 1:
        raise GradschedError(f"{strategy}: density must be in (0, 1] (fraction of elements sent), got {density}")
    return d


def layers_in_ready_order(profile: Profile) -> list[list[int]]:
    """Tensor indices grouped by layer, layers in the order their backward ends."""
    groups: dict[int, list[int]] = {}
    for i in profile.order:
        groups.setdefault(profile.layer_of[i], []).append(i)
    return list(groups.values())


@register("topk", sparse=True)
def plan(profile: Profile, cluster: Cluster, density: float = DEFAULT_DENSITY) -> Plan:
    d = check_density("topk", density)
    ops = whole_tensor_ops(layers_in_ready_order(profile), profile, collective=SPARSE, density=d)
    return Plan("topk", ops, profile.fingerprint, profile.model, {"density": d})
