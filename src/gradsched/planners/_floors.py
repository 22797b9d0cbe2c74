"""What the planners' floors (seconds no plan of a kind can beat, from the profile alone) share: ``auto``'s
(:func:`gradsched.planners.auto.usbyte_floor_s` and its kin) and ``usbyte``'s whole groups
(:func:`gradsched.planners._contiguous.group_floor_s`)."""

from __future__ import annotations

from gradsched.cluster import CollectiveCost
from gradsched.profile import Profile


def first_ready_s(profile: Profile) -> float:
    """When the first gradient is ready, less the simulator's simultaneity (two of ``EPS_S``: an operation
    may start that much before its layer's end, as the simulator counts times that close as one)."""
    from gradsched.sim.engine import EPS_S  # the simulator imports planners' types only

    return max(0.0, min(profile.ready_s, default=0.0) - 2 * EPS_S)


def plain_lines(costs: list) -> bool:
    """Whether every cost is a plain line with a start-up and a slope of 0 or more (no table)."""
    return all(type(c) is CollectiveCost and c.points is None and c.alpha_s >= 0 and c.beta_s_per_byte >= 0
               for c in costs)
