"""``ddp``: PyTorch DDP's own buckets: 1 MiB first, then ``bucket_cap_mb`` (25), never split.

In the runtime, ``ddp`` means real ``DistributedDataParallel`` (the reference); this
plan is what the simulator predicts for it, and what gradsched runs when asked to
mimic DDP's buckets with its own executor."""

from __future__ import annotations

import itertools

from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.planners._tables import whole_ops
from gradsched.constants import MiB
from gradsched.planners._buckets import buckets_by_size
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile


BUCKET_CAP_MB = Option("bucket_cap_mb", float, 25.0, low=0, low_open=True, high=1e9,
                       doc="bucket size in MiB after the first", size=True)
"""DDP's bucket size, declared once: this planner's option and the drop-in's ``bucket_cap_mb``."""
OPTIONS = (
    BUCKET_CAP_MB,
    Option("first_bucket_mb", float, 1.0, low=0, low_open=True, high=1e9, doc="size of the first bucket in MiB",
           size=True),
)


@register("ddp", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0) -> Plan:
    caps = itertools.chain([first_bucket_mb * MiB], itertools.repeat(bucket_cap_mb * MiB))
    groups = buckets_by_size(profile, caps)
    return Plan("ddp", whole_ops(groups, profile), profile.fingerprint, profile.model,
                {"bucket_cap_mb": bucket_cap_mb, "first_bucket_mb": first_bucket_mb})
