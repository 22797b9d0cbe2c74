"""Starting a job's ranks on this machine: a free port and the ``torch.distributed.run`` command.

``gradsched train`` and ``gradsched bench`` both launch their workers over loopback the
same way; the self-test and multi-process tests take a port from here too.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the rendezvous binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_command(module: str, nproc: int, cfg_path: Path | str) -> list[str]:
    """``python -m torch.distributed.run`` starting ``nproc`` ranks of ``python -m module cfg_path`` here."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", module, str(cfg_path)]


def loopback_node_commands(module: str, nodes: int, nproc_per_node: int, cfg_path: Path | str) -> list[list[str]]:
    """One ``torch.distributed.run`` per emulated node, all on 127.0.0.1: node ``i`` starts global ranks
    ``[i * M, (i + 1) * M)`` of ``python -m module cfg_path`` with torchrun's ``LOCAL_WORLD_SIZE=M``,
    ``LOCAL_RANK`` and ``GROUP_RANK=i``, as on ``nodes`` machines (the network is this one's loopback)."""
    port = free_port()
    return [[sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}", f"--nnodes={nodes}",
             f"--node-rank={i}", "--master-addr=127.0.0.1", f"--master-port={port}", "-m", module, str(cfg_path)]
            for i in range(nodes)]
