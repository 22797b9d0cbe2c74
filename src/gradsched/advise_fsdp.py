"""FSDP2 advice: which ``fully_shard`` grouping and prefetch to use, predicted by simulation.

PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) makes one parameter all-gather and one
gradient reduce-scatter per ``fully_shard`` call (a module or a list of modules): the grouping
is the merge decision (ANCHORS.md).  Seen from the network, a grouping with
``reshard_after_forward=False`` and forward prefetch of the next group is a decoupled plan of
the same groups: each group's reduce-scatter when its gradients are complete in backward, its
all-gather done before its first layer's forward (``gradsched.plan``'s ``reduce-scatter`` /
``all-gather`` operations; FSDP gathers parameters where DeAR gathers gradients, the same bytes
for fp32 parameters).  So each candidate grouping is simulated as such a plan:

- ``per layer``: one ``fully_shard`` per layer (module that owns parameters);
- ``every k layers`` (k = 2, 4, 8, 16): ``fully_shard`` on lists of k consecutive layers
  (``per block`` for a model of blocks of k layers);
- ``within N MB``: consecutive layers while a group stays within N MB (1-256);
- ``one group``: ``fully_shard`` on the root only (one all-gather, one reduce-scatter);

beside PyTorch DDP's default buckets and gradsched's best plan.  Not modelled: with
``reshard_after_forward=True`` (FSDP2's default for non-root modules) each group is gathered
again in backward, one more all-gather per group in backward; the advice says so, and
advises ``reshard_after_forward=False`` where memory allows.  Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.planners.dear import layers_forward, nearby_groups, threshold_groups, two_phase_ops
from gradsched.profile import Profile
from gradsched.sim import simulate

EVERY_LAYERS = (1, 2, 4, 8, 16)
WITHIN_MB = (1.0, 4.0, 16.0, 64.0, 256.0)


@dataclass(frozen=True)
class FsdpChoice:
    """One grouping: its name, each group's first and last tensor names, and its predicted iteration."""

    grouping: str
    groups: list[tuple[str, str]]
    predicted_s: float


@dataclass(frozen=True)
class FsdpAdvice:
    model: str
    world_size: int
    best: FsdpChoice
    ddp_default_s: float
    gradsched_strategy: str
    gradsched_predicted_s: float
    choices: list[FsdpChoice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedup_best_vs_ddp_default"] = self.ddp_default_s / self.best.predicted_s
        return d


def candidates(profile: Profile) -> list[tuple[str, list[list[int]]]]:
    """The groupings the advice compares (module docstring), each with its name."""
    n_layers = len(layers_forward(profile))
    out = [("per layer" if k == 1 else f"every {k} layers", nearby_groups(profile, k))
           for k in EVERY_LAYERS if k == 1 or k < n_layers]
    out += [(f"within {mb:g} MB", threshold_groups(profile, mb * 1e6)) for mb in WITHIN_MB]
    out.append(("one group", [[t for layer in layers_forward(profile) for t in layer]]))
    return out


def fsdp_advice(profile: Profile, cluster: Cluster) -> FsdpAdvice:
    """Simulate each candidate grouping as FSDP2 runs it and return them, fastest first."""
    names = [t.name for t in profile.tensors]
    choices, seen = [], set()
    for label, groups in candidates(profile):
        ops = two_phase_ops(groups, profile)
        if ops in seen:
            continue
        seen.add(ops)
        plan = Plan("fsdp2", ops, profile.fingerprint, profile.model, {"grouping": label}, overlap_forward=True)
        predicted = simulate(plan, profile, cluster, timeline=False).iteration_s
        spans = [(names[min(g)], names[max(g)]) for g in groups]
        choices.append(FsdpChoice(label, spans, predicted))
    choices.sort(key=lambda c: (round(c.predicted_s, 9), len(c.groups)))  # ties (to the ns): fewer groups
    ddp = simulate(make_plan("ddp", profile, cluster), profile, cluster, timeline=False).iteration_s
    auto = make_plan("auto", profile, cluster)
    auto_s = simulate(auto, profile, cluster, timeline=False).iteration_s
    return FsdpAdvice(profile.model, cluster.world_size, choices[0], ddp, auto.options.get("chose", "auto"), auto_s,
                      choices)


def format_fsdp_advice(advice: FsdpAdvice) -> str:
    """The advice as ``gradsched advise --fsdp`` prints it."""
    ms = 1e3
    a = advice
    lines = [f"gradsched advise --fsdp: {a.model or 'model'}, {a.world_size} workers (times predicted by simulation)",
             "", f"  {'fully_shard grouping':<28} {'groups':>7} {'iteration':>11}  {'vs DDP default':>14}"]
    for c in a.choices:
        lines.append(f"  {c.grouping:<28} {len(c.groups):>7} {c.predicted_s * ms:>8.1f} ms  "
                     f"{a.ddp_default_s / c.predicted_s:>13.2f}x")
    lines += [f"  {'PyTorch DDP default':<28} {'':>7} {a.ddp_default_s * ms:>8.1f} ms  {1.0:>13.2f}x",
              f"  {'gradsched best (' + a.gradsched_strategy + ')':<28} {'':>7} "
              f"{a.gradsched_predicted_s * ms:>8.1f} ms  {a.ddp_default_s / a.gradsched_predicted_s:>13.2f}x",
              "", f"Advised: fully_shard {a.best.grouping} ({len(a.best.groups)} groups, first..last parameter):"]
    for first, last in a.best.groups[:12]:
        lines.append(f"  {first} .. {last}")
    if len(a.best.groups) > 12:
        lines.append(f"  ... {len(a.best.groups) - 12} more")
    lines += ["then fully_shard(model) on the root; prefetch one group ahead: "
              "group[i].set_modules_to_forward_prefetch([group[i + 1]]) (the gathers overlap the forward, as "
              "simulated); reshard_after_forward=False where memory allows (True gathers each group again in "
              "backward, not simulated)."]
    return "\n".join(lines)


def blocks_plan(profile: Profile, blocks: list[str]) -> Plan:
    """``fully_shard`` on each module named in ``blocks`` and on the root, as a decoupled plan: one group per
    block (its tensors, by name prefix), and one of the tensors no block holds (the root's own)."""
    groups: list[list[int]] = [[] for _ in blocks]
    root: list[int] = []
    for i, t in enumerate(profile.tensors):
        k = next((k for k, b in enumerate(blocks) if t.name.startswith(b + ".")), None)
        (root if k is None else groups[k]).append(i)
    groups = [g for g in groups if g] + ([root] if root else [])
    return Plan("fsdp2", two_phase_ops(groups, profile), profile.fingerprint, profile.model,
                {"grouping": "per block"}, overlap_forward=True)
