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
from gradsched.plan import SPARSE, Plan, whole_tensor_ops
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile

DEFAULT_DENSITY = 0.001


def layers_in_ready_order(profile: Profile) -> list[list[int]]:
    """Tensor indices grouped by layer, layers in the order their backward ends."""
    return [list(layer) for layer in profile.layer_table.ready]


OPTIONS = (Option("density", float, DEFAULT_DENSITY, low=0, low_open=True, high=1,
                  doc="fraction of each gradient's elements sent"),)


@register("topk", sparse=True, options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, density: float = DEFAULT_DENSITY) -> Plan:
    ops = whole_tensor_ops(layers_in_ready_order(profile), profile, collective=SPARSE, density=density)
    return Plan("topk", ops, profile.fingerprint, profile.model, {"density": density})
