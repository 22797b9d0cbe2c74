"""What ``gradsched train`` and ``gradsched bench`` hand their workers, typed (torch-free: the
command line builds it; :mod:`gradsched.jobconfig` is the old path).

The workers read the same JSON as before (``config.json`` in the run's folder):
:meth:`TrainConfig.to_dict` / :meth:`BenchConfig.to_dict` write it, ``from_dict`` reads it
back, so a field is named once, here, and a misspelt one fails where it is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Iterator, Mapping
from typing import Any

from gradsched.errors import InternalError

ERROR_FILE = "error.rank{rank}.json"  # a failing rank's own error, in out_dir (gradsched.torch.jobs.worker)
PROGRESS_PREFIX = "gradsched progress: "  # a line rank 0 prints while training; the command streams it


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One ``gradsched train`` run, as every rank reads it."""

    model: str  # a built-in model (gradsched.constants.MODEL_NAMES) or the user's MODULE:FUNCTION
    strategy: str  # planned at start-up, unless plan_path is given
    steps: int
    batch_size: int  # per rank
    optimizer: str  # "sgd" | "adam"
    lr: float
    seed: int
    timeout_s: float  # a collective that takes longer fails the run
    out_dir: str  # where rank 0 writes result.json
    warmup: int = 0  # steps left out of the timing figures
    plan_path: str | None = None  # run this plan file instead of planning `strategy`
    profile_path: str | None = None  # plan with this measured profile ...
    cluster_path: str | None = None  # ... and this cluster
    plan_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    sparse_options: dict[str, Any] | None = None
    no_torch_ddp: bool = False  # run "ddp" on gradsched's executor instead of PyTorch's DDP
    backend: str | None = None  # None: nccl with GPUs, else gloo
    threads: int = 1  # compute threads per rank
    save_params: str | None = None  # rank 0 saves the trained parameters here
    trace_path: str | None = None  # rank 0 writes the merged Chrome trace here
    progress: bool = False  # rank 0 prints progress lines (PROGRESS_PREFIX) while training

    def to_dict(self) -> dict[str, Any]:
        """The JSON the workers read."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Back from :meth:`to_dict` (written by ``gradsched train`` itself: a mismatch is a bug)."""
        return cls(**_checked_fields(cls, data, "train", require_all=False))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class BenchEntry(Mapping[str, Any]):
    """One row of ``gradsched bench`` as the workers build it (in ``config.json``: a plain object,
    :meth:`to_dict` / :meth:`from_dict`).

    Read it by attribute.  It also reads as the mapping it was before (``entry["label"]``,
    ``entry.get("ddp_kwargs")``, ``dict(entry)``: the fields that are set), for callers of
    :func:`gradsched.jobs.bench.entries` written against that; it compares equal to that dict."""

    label: str  # the row's name: a strategy, or ddp-<MB>mb / ddp-all for PyTorch DDP's bucket sizes
    strategy: str  # "ddp" for every PyTorch DDP row
    torch_ddp: bool  # PyTorch's own DistributedDataParallel, not gradsched's executor
    options: dict[str, Any] | None = None  # planner options of a gradsched row
    ddp_kwargs: dict[str, Any] | None = None  # DistributedDataParallel's keyword arguments (bucket_cap_mb)
    fsdp2: bool = False  # the row runs PyTorch FSDP2's fully_shard per block (not a gradsched strategy)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the three names, and options / ddp_kwargs / fsdp2 where given."""
        out: dict[str, Any] = {"label": self.label, "strategy": self.strategy, "torch_ddp": self.torch_ddp}
        out.update({k: v for k, v in (("options", self.options), ("ddp_kwargs", self.ddp_kwargs)) if v is not None})
        if self.fsdp2:
            out["fsdp2"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchEntry:
        """Back from :meth:`to_dict` (or the old dict): a misspelt or missing field is an :class:`InternalError`."""
        given = dict(data)
        required = {"label", "strategy", "torch_ddp"}
        _checked_fields(cls, given, "bench entry", require_all=False)
        if not required <= set(given):
            raise InternalError(f"bench entry config: missing field(s) {', '.join(sorted(required - set(given)))}")
        return cls(**given)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchConfig:
    """One ``gradsched bench`` job, as every rank reads it."""

    model: str  # a built-in model, the user's MODULE:FUNCTION, or a replayed profile (REPLAY_PREFIX + path)
    seed: int  # every copy of the model and every batch start from it
    batch_size: int  # per rank
    lr: float  # SGD learning rate (momentum 0.9) of every entry, the probes and the compute-only step
    entries: list[BenchEntry]  # what to run: gradsched.jobs.bench.entries
    steps: int  # steps per entry per round
    rounds: int  # rounds at most, warmup_rounds of them not counted (fewer where round_tol stops them)
    warmup_rounds: int  # rounds left out of the figures
    profile_iterations: int  # profiler iterations at start-up
    net_reps: int  # timed repetitions per size in the network benchmark
    probe: bool  # run the contention probe (and the runtimes' overhead probe)
    probe_s: float  # about how long the start-up probes take, both together
    resample_share: float  # between rounds, the probes sample again within this share of the rounds' time
    contention_history: list[dict[str, float]]  # earlier jobs' contention figures (--contention-from), emulated s
    timeout_s: float  # a collective that takes longer fails the job
    progress: bool  # rank 0 shows a progress bar
    out_dir: str  # where rank 0 writes bench.json
    backend: str  # the process group's backend ("gloo": CPU tensors)
    threads: int  # compute threads per rank
    dilate: float = 1.0  # --dilate K: the workers' seconds are K emulated ones (gradsched.jobs.results)
    scale_bytes: int = 1  # --scale-bytes S: the replayed tensors are 1/S of the emulated ones
    round_tol: float = 0.0  # --round-tol: the rounds stop once one moves no row's median more (gradsched.jobs.rounds)
    min_rounds: int = 2  # --min-rounds: counted rounds before they may stop early
    warmup_steps: int = 0  # steps per entry in the warm-up rounds (0: steps; gradsched.jobs.budget)
    label: str = ""  # what the progress bar calls the model (a replay: --replay as given, not its temporary copy)
    # what the user set of what the 15-minute budget may cut (gradsched.jobs.budget.Given.to_dict), where it applies
    # (a replay on the testbed): the workers fit the budget again after start-up; empty: no budget
    budget: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON the workers read."""
        return {**dataclasses.asdict(self), "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchConfig:
        """Back from :meth:`to_dict` (written by ``gradsched bench`` itself: a mismatch is a bug)."""
        fields = _checked_fields(cls, data, "bench", require_all=True)
        return cls(**{**fields, "entries": [BenchEntry.from_dict(e) for e in fields["entries"]]})


def _checked_fields(cls: type, data: dict[str, Any], what: str, *, require_all: bool) -> dict[str, Any]:
    """``data`` if its keys are ``cls``'s fields (all of them with ``require_all``); else an :class:`InternalError`."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InternalError(f"{what} config: unknown field(s) {', '.join(unknown)}")
    missing = sorted(names - set(data)) if require_all else []
    if missing:
        raise InternalError(f"{what} config: missing field(s) {', '.join(missing)}")
    return data
