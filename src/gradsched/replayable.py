"""Which profiles a replay can emulate, checked without torch.

``gradsched bench --replay`` and ``--model replay:PROFILE`` read and check the profile in
the command's own process, so that a bad file is one line (exit 2) in a fraction of a
second, before torch is imported or any worker starts; the replay model
(:mod:`gradsched.torch.jobs.replay`) builds from the same checks.
"""

from __future__ import annotations

from pathlib import Path

from gradsched.errors import GradschedError
from gradsched.profile import Profile

ELEMENT_BYTES = (2, 4, 8)  # float16, float32, float64: the parameters a replay makes


def check_element_bytes(profile: Profile, i: int) -> int:
    """Tensor ``i``'s element width; raises GradschedError unless a replay can make it."""
    t = profile.tensors[i]
    if t.element_bytes not in ELEMENT_BYTES:
        raise GradschedError(f"profile tensor {t.name!r} has {t.element_bytes}-byte elements; replay makes "
                             f"parameters of 2, 4 or 8 bytes (float16, float32, float64) only")
    return t.element_bytes


def check_replayable(profile: Profile) -> list[list[int]]:
    """Tensor indices per layer, in forward order; raises GradschedError if ``profile``
    cannot be replayed (elements of another width, a layer's tensors not adjacent)."""
    for i in range(profile.num_tensors):
        check_element_bytes(profile, i)
    groups: list[list[int]] = []
    seen: set[int] = set()
    for i, lid in enumerate(profile.layer_of):
        if groups and profile.layer_of[groups[-1][-1]] == lid:
            groups[-1].append(i)
            continue
        if lid in seen:
            raise GradschedError(f"profile {profile.model!r}: layer of tensor {profile.tensors[i].name!r} also owns "
                                 f"earlier tensors that are not next to it; replay needs each layer's tensors "
                                 f"adjacent in forward order")
        seen.add(lid)
        groups.append([i])
    return groups


def load_profile(source: str) -> Profile:
    """A profile from a file path, or a bundled name (``googlenet-k80``, ``googlenet``)."""
    from gradsched.bundled import bundled_profile, profile_names

    if Path(source).exists():  # a file, or something that is not one: Profile.load says which
        return Profile.load(source)
    if source in profile_names():
        return bundled_profile(source)
    raise GradschedError(f"replay profile {source!r} is neither a file nor a bundled profile "
                         f"({', '.join(profile_names())}); give a gradsched.profile/1 file")
