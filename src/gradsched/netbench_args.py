"""The network benchmark's command line, shared by ``gradsched netbench`` and
``python -m gradsched.torch.measure.netbench`` (the ranks it launches).

Torch-free, so that the command can list its flags without importing torch and the
measuring module can parse the same flags without importing the command layer.
"""

from __future__ import annotations

import argparse

from typing import Sequence

from gradsched.cluster import COLLECTIVES
from gradsched.errors import GradschedError

MIN_BYTES = 4 * 1024
MAX_BYTES = 256 * 1024 * 1024
BACKENDS = ("gloo", "nccl", "mpi", "ucc")  # torch.distributed's process-group backends


def sizes_bytes(min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES) -> list[int]:
    """Powers of two from ``min_bytes`` up to ``max_bytes`` (both rounded down to a power of two)."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise GradschedError(f"need 4 <= min bytes <= max bytes, got {min_bytes} and {max_bytes}")
    lo, hi = 1 << (min_bytes.bit_length() - 1), 1 << (max_bytes.bit_length() - 1)
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def top_bytes(collective: str, min_bytes: int, max_bytes: int, world: int) -> int:
    """The largest size timed for ``collective``: an all-gather's output is ``world`` times its input."""
    return max_bytes if collective == "allreduce" else max(min_bytes, max_bytes // world)


def check_sizes(min_bytes: int, max_bytes: int, world: int, collectives: Sequence[str]) -> None:
    """Every collective gets at least two sizes, which fitting its line needs: checked before measuring
    (``--max-bytes 8192`` failed only after every size was timed)."""
    for name in collectives:
        if len(sizes_bytes(min_bytes, top_bytes(name, min_bytes, max_bytes, world))) < 2:
            need = 2 * min_bytes * (1 if name == "allreduce" else world)
            raise GradschedError(f"--min-bytes {min_bytes} and --max-bytes {max_bytes} leave {name} on {world} ranks "
                                 f"one size, and fitting its cost needs two: give --max-bytes {need} or more")


def parse_depths(text: str) -> tuple[int, ...]:
    """``--queue-depths``: comma-separated queue depths of 2 or more (empty: none)."""
    try:
        depths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GradschedError(f"--queue-depths {text!r}: give comma-separated integers, e.g. 2,4") from None
    if any(k < 2 or k > 64 for k in depths):
        raise GradschedError(f"--queue-depths {text!r}: each depth must be between 2 and 64")
    return depths


def check_backend(backend: str | None) -> None:
    """A process-group backend torch.distributed has, named before any rank starts."""
    if backend is not None and backend not in BACKENDS:
        raise GradschedError(f"--backend {backend!r} is not a torch.distributed backend; give one of "
                             f"{', '.join(BACKENDS)} (default: nccl with CUDA, else gloo)")


DEFAULT_OUTPUT = "cluster.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``gradsched netbench`` and ``python -m gradsched.torch.measure.netbench``."""
    p.add_argument("-o", "--output", default=None,
                   help="cluster file to write (default cluster.json; with --json and no -o, no file is left)")
    p.add_argument("--min-bytes", type=int, default=MIN_BYTES, help=f"smallest size (default {MIN_BYTES})")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=f"largest size (default {MAX_BYTES} = 256 MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size; the median is kept (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size first (default 2)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated, from {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--ranks-per-node", "--ranks-per-host", dest="ranks_per_node", type=int, default=None, metavar="M",
                   help="ranks on each node, nodes holding consecutive ranks (default: LOCAL_WORLD_SIZE, which "
                        "torchrun sets, else 1; --ranks-per-host is the same flag); "
                        "with several nodes of several ranks the all-reduce is also timed "
                        "inside each node and across nodes and the cluster's topology written")
    p.add_argument("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--queue-depths", default="", metavar="K,...",
                   help="also time each collective in queues of K asynchronous operations issued together (e.g. "
                        "2,4), beside one alone, from 1 MiB a rank up: the cluster's queued rule "
                        "(docs/cost-model.md, \"Queued streams\"; default: none)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
