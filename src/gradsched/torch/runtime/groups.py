"""Side process groups that are safe on a subgroup, and which backend serves which device.

The runtime keeps some traffic off the user's group (used flags and buffers on a
*control* group; a progress thread's collectives on a *private* copy), so it never
interleaves with the plan's collectives differently on different ranks.

``dist.new_group`` normally has to be entered by *every* process of the job, for every
group, in the same order: it names the group from a counter that each process
advances.  A wrapper built on a subgroup (4 ranks as 2 data-parallel groups of 2) is
constructed only by that subgroup's members, so a plain ``new_group`` there would give
both subgroups the same name (their rendezvous keys collide in the store) and leave
the counter of members and non-members apart (the user's next collective
``new_group`` would then mismatch).  With ``use_local_synchronization=True`` only the
members enter, the counter is untouched, and the name is a hash of the member ranks
and of how many groups this process already holds.  That count must be the same on
every member, so :func:`side_group` is called only after the start-up check
(:mod:`gradsched.torch.runtime.startup`) has compared it across the group.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def backend_of(group: dist.ProcessGroup, device: torch.device | str) -> str:
    """The backend that carries ``device``'s tensors on ``group`` (``"gloo"``, ``"nccl"``, ...).

    Works for groups made with one backend, with ``"cpu:gloo,cuda:nccl"`` and with
    ``init_process_group()`` without a backend (whose name is ``"undefined"``)."""
    return backend_for(str(dist.get_backend_config(group)), torch.device(device).type)


def backend_for(config: str, device_type: str) -> str:
    """From a backend configuration (``"gloo"``, ``"cpu:gloo,cuda:nccl"``) the backend of one device
    type; ``""`` when none serves it.  A single name serves every device, as PyTorch reads it."""
    if ":" not in config:
        return config.strip()
    for part in config.split(","):
        dev, _, name = part.partition(":")
        if dev.strip() == device_type:
            return name.strip()
    return ""


def uses_nccl(group: dist.ProcessGroup, device: torch.device | str) -> bool:
    """Whether ``device``'s tensors on ``group`` go through NCCL (completion is then on the stream)."""
    return backend_of(group, device) == "nccl"


def comm_device(group: dist.ProcessGroup) -> torch.device:
    """Where small control tensors (checks, object broadcasts) should live on ``group``:
    the CPU when some backend of the group serves it, else the current CUDA device."""
    if control_device_type(str(dist.get_backend_config(group))) == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def control_device_type(config: str) -> str:
    """``"cpu"`` where a backend of ``config`` takes CPU tensors, else ``"cuda"`` (a plain ``"nccl"``)."""
    return "cpu" if backend_for(config, "cpu") not in ("", "nccl") else "cuda"


def group_count() -> int:
    """How many process groups this process holds: part of a locally synchronised group's name."""
    return len(c10d._world.pg_names)


def is_whole_world(group: dist.ProcessGroup) -> bool:
    return dist.get_world_size(group) == dist.get_world_size()


def side_group(group: dist.ProcessGroup, timeout_s: float, gloo_threads: int | None = None) -> dist.ProcessGroup:
    """A new group with ``group``'s ranks and backend(s), entered by ``group``'s members only.

    Call it on every member at the same point (after the start-up check agreed on
    :func:`group_count`).  On the whole world the ordinary collective form is used.
    ``gloo_threads``: where gloo is the group's only backend, passed to ``new_group`` as gloo's options
    (``ProcessGroupGloo``'s worker threads; its default is two), which torch 2.13 drops: the group runs
    two whatever is asked (:func:`gloo_thread_group` gives the threads asked for)."""
    ranks = dist.get_process_group_ranks(group)
    config = str(dist.get_backend_config(group))
    timeout = timedelta(seconds=timeout_s)
    extra = {}
    if gloo_threads is not None and gloo_only(config):
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._threads = gloo_threads
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        extra["pg_options"] = opts
        config = "gloo"  # the options are gloo's: name it alone
    if is_whole_world(group):
        return dist.new_group(ranks, backend=config, timeout=timeout, **extra)
    return dist.new_group(ranks, backend=config, timeout=timeout, use_local_synchronization=True, **extra)


def gloo_only(config: str) -> bool:
    """Whether a backend configuration (``"gloo"``, ``"cpu:gloo"``, ``"cpu:gloo,cuda:nccl"``) names gloo alone."""
    names = {part.partition(":")[2].strip() if ":" in part else part.strip() for part in config.split(",")}
    return names == {"gloo"}


def gloo_thread_group(group: dist.ProcessGroup, timeout_s: float, threads: int) -> dist.ProcessGroup:
    """Like :func:`side_group`, on a gloo of ``threads`` worker threads where gloo is ``group``'s only backend
    (else :func:`side_group`'s copy).

    ``new_group`` in torch 2.13 builds gloo without its ``pg_options`` (``_new_process_group_helper``
    passes the timeout alone), so ``side_group``'s ``gloo_threads`` gives gloo's default two threads
    whatever it asks; a backend registered under its own name (:func:`threaded_gloo`) builds
    ``ProcessGroupGloo`` with the options itself."""
    config = str(dist.get_backend_config(group))
    if not gloo_only(config):
        return side_group(group, timeout_s)
    ranks = dist.get_process_group_ranks(group)
    timeout = timedelta(seconds=timeout_s)
    name = threaded_gloo(threads)
    if is_whole_world(group):
        return dist.new_group(ranks, backend=name, timeout=timeout)
    return dist.new_group(ranks, backend=name, timeout=timeout, use_local_synchronization=True)


def threaded_gloo(threads: int) -> str:
    """The name of a CPU backend, registered with ``torch.distributed`` on first use: gloo with ``threads``
    worker threads (its queued collectives run that many at a time)."""
    name = f"gloo_threads{threads}"
    if name not in dist.Backend.backend_list:
        def make(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroupGloo:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._threads = threads
            opts._devices = [dist.ProcessGroupGloo.create_default_device()]
            return dist.ProcessGroupGloo(store, rank, size, opts)

        dist.Backend.register_backend(name, make, devices=["cpu"])
    return name

