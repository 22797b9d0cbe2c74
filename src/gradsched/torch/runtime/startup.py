"""Start-up collectives with a deadline: the consistency check, state broadcasts, objects.

gloo and NCCL match collectives by the order each rank calls them, so two ranks
that were configured differently do not fail: they wait for each other forever,
or pair unrelated collectives.  :func:`check_consistency` therefore compares,
before anything else, every setting that changes the *sequence* of collectives
(the plan and its issue order, ``find_unused_parameters``, ``broadcast_buffers``,
the parameters' and buffers' dtypes, ...), one all-gather of a fixed-size record,
and names the setting that differs on every rank.  Each collective here is issued
asynchronously and waited for with ``timeout_s``, so a rank that never arrives
gives a :class:`~gradsched.torch.runtime.ops.CollectiveError` instead of a hang.
"""

from __future__ import annotations

import hashlib
import pickle
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gradsched.errors import GradschedError
from gradsched.torch.runtime.ddp_args import DDPArgs
from gradsched.torch.runtime.groups import comm_device, group_count, is_whole_world
from gradsched.torch.runtime.ops import CollectiveError

FIELD_BYTES = 24  # per setting in the check's record: the value itself if short, else a digest

# gloo's worker thread drops its reference to a finished collective a moment after wait()
# returns.  Where that is the last reference and the process is already finalising (a script
# that exits right after gradsched's last collective), the collective's tensors are freed on
# that thread, which cannot take the GIL then and aborts the process ("terminate called
# without an active exception": 9 runs in 40 of a script ending with ``gradsched.torch.advise``,
# 0 in 80 with this hold).  The latest object collectives' Work handles stay referenced here,
# so they are freed on the main thread.
_HELD: dict[str, list[Any]] = {}


def _hold(key: str, *works: Any) -> None:
    _HELD[key] = list(works)

# setting -> (what it is called in the error, what to do about a mismatch)
FIELDS: dict[str, tuple[str, str]] = {  # causes first: a dtype difference also changes the plan's hash
    "param_dtypes": ("the parameters' names, shapes and dtypes",
                     "build the same model, in the same dtypes, on every rank"),
    "buffer_dtypes": ("the buffers' names, shapes and dtypes", "build the same model on every rank"),
    "device": ("the parameters' device type", "put the model on the same kind of device on every rank"),
    "find_unused": ("find_unused_parameters (or static_graph)", "pass the same value on every rank"),
    "buffers_sync": ("broadcast_buffers", "pass the same value on every rank"),
    "shard_optimizer": ("shard_optimizer", "pass the same value on every rank"),
    "init_sync": ("init_sync", "pass the same value on every rank"),
    "plan_options": ("plan options", "pass the same plan_options on every rank"),
    "sparse": ("sparse options", "pass the same sparse_options on every rank"),
    "groups": ("the number of process groups created so far",
               "create the same process groups, in the same order, on every rank of this group before wrapping"),
    "plan": ("plan", "every rank must build the same model and plan it with the same strategy, profile and "
                     "cluster (or load one plan file)"),
    # after the plan: different plans can differ in whether ranks per node matter
    "ranks_per_node": ("ranks per node", "pass the same ranks_per_node on every rank (without it, LOCAL_WORLD_SIZE "
                                         "counts: launch nodes of equal size)"),
}


def plan_key(strategy: str, text: str) -> str:
    """What the check compares for the plan: its strategy and a digest of ``text`` (hash and issue order)."""
    return f"{strategy[:12]}:{hashlib.sha256(text.encode()).hexdigest()[:11]}"


def startup_settings(module: torch.nn.Module, group: dist.ProcessGroup, args: DDPArgs,
                     plan_options: dict[str, Any] | None) -> dict[str, str]:
    """Every setting but the plan (added once planned) that changes which collectives run, for the check."""
    params = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in module.named_parameters()]
    buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in module.named_buffers()]
    settings = {"param_dtypes": repr(params), "buffer_dtypes": repr(buffers),
                "device": ",".join(sorted({p.device.type for p in module.parameters()})),
                "find_unused": str(args.find_unused), "buffers_sync": str(args.forward_sync_buffers),
                "init_sync": f"{args.init_sync}/{args.init_sync_buffers}",
                "plan_options": repr(sorted((plan_options or {}).items(), key=lambda kv: kv[0]))}
    if not is_whole_world(group):  # side groups on a subgroup are named from this count (gradsched.torch.runtime.groups)
        settings["groups"] = str(group_count())
    return settings


def wait(work: Any, timeout_s: float, what: str, rank: int) -> None:
    """Wait for an asynchronous collective, or raise CollectiveError after ``timeout_s``."""
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except Exception as exc:
        raise CollectiveError(f"rank {rank}: {what} failed or timed out after {timeout_s:g} s: a peer rank "
                              f"probably died, never reached this point, or was configured differently ({exc})") from exc


def _encode(value: str) -> bytes:
    if len(value) <= FIELD_BYTES and value.isascii():
        return value.encode().ljust(FIELD_BYTES, b"\0")
    return ("#" + hashlib.sha256(value.encode()).hexdigest()[:FIELD_BYTES - 1]).encode()


def check_consistency(settings: dict[str, str], group: dist.ProcessGroup, timeout_s: float) -> None:
    """Raise a GradschedError on every rank if any setting differs between the ranks of ``group``.

    ``settings`` maps keys of :data:`FIELDS` to strings; every rank passes the same keys."""
    keys = [k for k in FIELDS if k in settings]
    record = b"".join(_encode(settings[k]) for k in keys)
    mine = torch.tensor(list(record), dtype=torch.uint8, device=comm_device(group))
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    wait(dist.all_gather(gathered, mine, group=group, async_op=True), timeout_s, "the start-up consistency check",
         rank)
    records = [t.cpu().numpy().tobytes() for t in gathered]
    for j, key in enumerate(keys):
        values = [r[j * FIELD_BYTES:(j + 1) * FIELD_BYTES].rstrip(b"\0").decode(errors="replace") for r in records]
        if len(set(values)) > 1:
            raise GradschedError(mismatch_message(key, values, rank))


def mismatch_message(key: str, values: list[str], rank: int) -> str:
    label, remedy = FIELDS[key]
    listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
    if key == "plan":  # the wording earlier versions used, which scripts may match
        return f"ranks hold different plans ({listing}; this is rank {rank}); {remedy}"
    return f"ranks disagree on {label} ({listing}; this is rank {rank}); {remedy}"


def broadcast_tensors(tensors: list[torch.Tensor], src: int, group: dist.ProcessGroup, timeout_s: float,
                      what: str) -> None:
    """Global rank ``src``'s values of ``tensors`` to every rank of ``group``: one broadcast per
    (device, dtype), flattened, each with a deadline.  A collective on ``group``."""
    rank = dist.get_rank(group)
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.device, t.dtype), []).append(t)
    with torch.no_grad():
        for ts in by_kind.values():
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            wait(dist.broadcast(flat, src=src, group=group, async_op=True), timeout_s, what, rank)
            offset = 0
            for t in ts:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


def broadcast_object(obj: Any, src: int, group: dist.ProcessGroup, timeout_s: float, what: str) -> Any:
    """``broadcast_object_list`` with a deadline: global rank ``src``'s ``obj`` on every rank of ``group``."""
    device, rank = comm_device(group), dist.get_rank(group)
    data = pickle.dumps(obj) if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sent = dist.broadcast(size, src=src, group=group, async_op=True)
    wait(sent, timeout_s, what, rank)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data
           else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    work = dist.broadcast(buf, src=src, group=group, async_op=True)
    wait(work, timeout_s, what, rank)
    _hold("broadcast_object", sent, work)
    return obj if dist.get_rank() == src else pickle.loads(buf.cpu().numpy().tobytes())


def gather_object(obj: Any, dst: int, group: dist.ProcessGroup, timeout_s: float, what: str) -> list[Any] | None:
    """``gather_object`` with a deadline: every rank's ``obj`` in group-rank order on global rank
    ``dst``, ``None`` elsewhere (an all-gather underneath, fine for the small records it carries)."""
    device, rank, world = comm_device(group), dist.get_rank(group), dist.get_world_size(group)
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    gathered = dist.all_gather(sizes, size, group=group, async_op=True)
    wait(gathered, timeout_s, what, rank)
    n = max(int(s.item()) for s in sizes)
    mine = torch.zeros(n, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty_like(mine) for _ in range(world)]
    work = dist.all_gather(bufs, mine, group=group, async_op=True)
    wait(work, timeout_s, what, rank)
    _hold("gather_object", gathered, work)
    if dist.get_rank() != dst:
        return None
    return [pickle.loads(b[:int(s.item())].cpu().numpy().tobytes()) for b, s in zip(bufs, sizes)]
