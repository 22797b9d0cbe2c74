"""The network benchmark's command line, shared by ``gradsched netbench`` and
``python -m gradsched.torch.measure.netbench`` (the ranks it launches).

Torch-free, so that the command can list its flags without importing torch and the
measuring module can parse the same flags without importing the command layer.
"""

from __future__ import annotations

import argparse

from gradsched.cluster import COLLECTIVES

MIN_BYTES = 4 * 1024
MAX_BYTES = 256 * 1024 * 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``gradsched netbench`` and ``python -m gradsched.torch.measure.netbench``."""
    p.add_argument("-o", "--output", default="cluster.json", help="cluster file to write (default cluster.json)")
    p.add_argument("--min-bytes", type=int, default=MIN_BYTES, help=f"smallest size (default {MIN_BYTES})")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=f"largest size (default {MAX_BYTES} = 256 MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size; the median is kept (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size first (default 2)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated, from {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--ranks-per-node", "--ranks-per-host", dest="ranks_per_node", type=int, default=None, metavar="M",
                   help="ranks on each node, nodes holding consecutive ranks (default: LOCAL_WORLD_SIZE, which "
                        "torchrun sets, else 1; --ranks-per-host is the same flag); with several nodes of several ranks the all-reduce is also timed "
                        "inside each node and across nodes and the cluster's topology written")
    p.add_argument("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
