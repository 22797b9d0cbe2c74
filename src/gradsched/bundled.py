"""Profiles and clusters shipped with gradsched: real measurements to plan against.

The data comes from the MG-WFBP authors' B-Caffe logs (GoogLeNet on 1-8 K80 nodes
over 10 Gb Ethernet), converted by ``scripts/convert_bcaffe.py``; docs/cost-model.md
explains every number and assumption.  Bundled so that a user (or a test, or the
paper-reproduction benchmark) can try every strategy on a real model and a real
network without measuring anything first.

Files live in ``gradsched/data`` as ``<name>.profile.json`` and
``<name>.p<world_size>.cluster.json``; they are read with :mod:`importlib.resources`,
so they work from a wheel or a zip as well as from a checkout.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from importlib.abc import Traversable

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.profile import Profile

DEFAULT_PROFILE = "googlenet"
DEFAULT_CLUSTER = "googlenet-10gbe"  # the OSU table: why it is the default is in docs/cost-model.md

# Other names for bundled profiles: what they are, where they were measured
ALIASES = {"googlenet-k80": "googlenet"}
_PROFILE_FILE = re.compile(r"^(?P<name>[\w.-]+?)\.profile\.json$")
_CLUSTER_FILE = re.compile(r"^(?P<name>[\w.-]+?)\.p(?P<world>\d+)\.cluster\.json$")


def _data_dir() -> Traversable:
    return resources.files("gradsched") / "data"


def _files() -> list[str]:
    return sorted(entry.name for entry in _data_dir().iterdir() if entry.name.endswith(".json"))


def profile_names() -> list[str]:
    """Names accepted by :func:`bundled_profile` (file names, then their aliases)."""
    names = [m["name"] for f in _files() if (m := _PROFILE_FILE.match(f))]
    return names + [alias for alias, name in ALIASES.items() if name in names]


def cluster_names() -> list[str]:
    """Names accepted by :func:`bundled_cluster`."""
    return sorted({m["name"] for f in _files() if (m := _CLUSTER_FILE.match(f))})


def cluster_world_sizes(name: str = DEFAULT_CLUSTER) -> list[int]:
    """World sizes at which cluster ``name`` was measured, ascending."""
    sizes = sorted(int(m["world"]) for f in _files() if (m := _CLUSTER_FILE.match(f)) and m["name"] == name)
    if not sizes:
        raise GradschedError(f"no bundled cluster {name!r}; bundled clusters: {', '.join(cluster_names()) or 'none'}")
    return sizes


def _parse(filename: str) -> object:
    return json.loads((_data_dir() / filename).read_text())


def bundled_profile(name: str = DEFAULT_PROFILE) -> Profile:
    """The bundled profile ``name`` (see :func:`profile_names`)."""
    if name not in profile_names():
        raise GradschedError(f"no bundled profile {name!r}; bundled profiles: {', '.join(profile_names()) or 'none'}")
    filename = f"{ALIASES.get(name, name)}.profile.json"
    return Profile.from_dict(_parse(filename), f"gradsched/data/{filename}")


def bundled_cluster(name: str = DEFAULT_CLUSTER, world_size: int | None = None) -> Cluster:
    """The bundled cluster ``name`` at ``world_size`` ranks.

    ``None`` gives the largest measured world size (8 for GoogLeNet's cluster, the
    paper's headline setting).  A world size that was not measured is extrapolated
    (:meth:`Cluster.at_world_size`, ring formulas) from the nearest measured one,
    the larger on a tie, because the measured table is only exact where it was taken."""
    sizes = cluster_world_sizes(name)
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise GradschedError(f"world size must be a positive integer, got {world_size!r}")
    target = sizes[-1] if world_size is None else world_size
    nearest = min(sizes, key=lambda p: (abs(p - target), -p))
    filename = f"{name}.p{nearest}.cluster.json"
    cluster = Cluster.from_dict(_parse(filename), f"gradsched/data/{filename}")
    return cluster if nearest == target else cluster.at_world_size(target)
