"""bytescheduler's refusal of a plan with too many blocks suggests a value that fits (issue 39, item 7)."""

from __future__ import annotations

import re

import pytest

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile
from gradsched.errors import GradschedError
from gradsched.planners import bytescheduler, make_plan


def huge_profile() -> Profile:
    """Two 40-TB fp32 tensors: the default 4 MiB blocks make 19 M operations, nearly twice the limit."""
    numel = 10 ** 13
    return Profile("huge", (TensorProfile("a", numel, 4 * numel, 0.0, 1e-3),
                            TensorProfile("b", numel, 4 * numel, 0.0, 1e-3)))


@pytest.mark.parametrize("partition_bytes", [None, 4 << 20, 1 << 10, (4 << 20) + 3])
def test_the_suggested_partition_bytes_is_larger_and_fits(partition_bytes):
    profile = huge_profile()
    cluster = Cluster(2, CollectiveCost(1e-5, 1e-9))
    options = {} if partition_bytes is None else {"partition_bytes": partition_bytes}
    given = partition_bytes or 4 << 20
    with pytest.raises(GradschedError, match="cuts this model into") as err:
        make_plan("bytescheduler", profile, cluster, **options)
    suggested = int(re.search(r"e\.g\. (\d+)", str(err.value)).group(1))
    assert suggested > given  # never the value that just failed
    assert bytescheduler.count_blocks(profile, suggested) <= bytescheduler.MAX_OPERATIONS
    assert bytescheduler.count_blocks(profile, suggested // 2) > bytescheduler.MAX_OPERATIONS or suggested // 2 <= given
