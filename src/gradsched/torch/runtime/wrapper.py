"""``gradsched.torch.DistributedDataParallel``: DDP's place, any gradsched plan.

    model = gradsched.torch.DistributedDataParallel(module, "mgwfbp")   # or a Plan
    opt = gradsched.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()     # gradients averaged over ranks, like DDP
        opt.step()

The strategy name ``"ddp"`` runs PyTorch's own DDP (the reference); any other name,
or a :class:`~gradsched.plan.Plan` (including one made by the ``ddp`` planner), runs
gradsched's executor.  At start-up every rank checks that it holds the same plan
(its content hash and issue order) and fails with a clear error otherwise, then
takes rank 0's parameters and buffers, as DDP does.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gradsched._validate import timeout_s as check_timeout_s
from gradsched.advise import DDP_DEFAULT_MB
from gradsched.cluster import Cluster
from gradsched.errors import GradschedError, InternalError
from gradsched.options import check
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.timeline import Timeline
from gradsched.torch.runtime.autotune import AutoTuneConfig, AutoTuner, TunedModel
from gradsched.torch.runtime import inflight
from gradsched.torch.runtime.decoupled import DecoupledAllReduce, executable
from gradsched.torch.runtime.sharded import SHARD_OPTIMIZER, ShardedOptimizer, shard
from gradsched.torch.runtime.ddp_args import DDPArgs, plan_choice, resolve, split_positional, to_device
from gradsched.torch.runtime import ddp_errors
from gradsched.torch.runtime import shutdown
from gradsched.torch.runtime.executor import PENDING, Executor, private_group
from gradsched.torch.runtime.gating import ForwardGate
from gradsched.torch.runtime.groups import is_whole_world, side_group
from gradsched.torch.runtime.hosttime import HostTimer
from gradsched.torch.runtime.link import ModelLink, UpdateLink
from gradsched.torch.runtime.misuse import check_module, claim
from gradsched.torch.runtime.ops import CollectiveError
from gradsched.torch.runtime.nodes import ranks_per_node as resolve_ranks_per_node, uses_nodes
from gradsched.torch.runtime.planning import (default_cluster, in_profile_order, issue_order, profile_from_module,
                                      resolve_plan, trainable_parameters)
from gradsched.torch.runtime.startup import broadcast_tensors, check_consistency, plan_key, startup_settings
from gradsched.torch.runtime.memory import trim_heap
from gradsched.torch.runtime.torch_ddp import TorchDDPPool, after_backward, is_torch_ddp, reduce_every_backward
from gradsched.torch.runtime.trace import FORWARD, Tracer, merge_timelines

DEFAULT_TIMEOUT_S = 300.0
_SPARSE_KEY = "_gradsched_sparse"
_SWITCHED = object()  # the thin baseline forward's answer where the tuner left the baseline at this iteration


class DistributedDataParallel(nn.Module):
    """Data-parallel wrapper executing a gradsched plan (or real DDP for ``"ddp"``).

    Args:
        module: the model; every rank builds the same one.
        plan: a strategy name (``gradsched.planners.strategy_names()``) or a Plan whose
            tensor indices are those of ``profile`` (given) or of
            ``trainable_parameters(module)`` (registration order); default (``None``): DDP's
            bucket rule (``bucket_cap_mb``) on gradsched's executor (docs/runtime.md).  A list
            here is DDP's positional ``device_ids``.
        process_group: default: the world; a subgroup works (its members alone wrap).
        device_ids, output_device, dim, init_sync, bucket_cap_mb, check_reduction,
            gradient_as_bucket_view, static_graph, device_mesh (and DDP's newer arguments
            by keyword): PyTorch DDP's, with DDP's meaning, or a GradschedError naming what
            cannot be honoured (:mod:`gradsched.torch.runtime.ddp_args`).
        profile, cluster: what a strategy name is planned with; default: sizes from
            the parameters and a loopback-like cluster (measure both for good plans).
        plan_options: options of the strategy (``{"mb": 4}`` for ``threshold``).
        timeout_s: a collective (the start-up ones included) that does not complete in this time raises
            :class:`~gradsched.torch.runtime.ops.CollectiveError` (a ``GradschedError``).
        find_unused_parameters: allow parameters that get no gradient in a backward
            (costs one small all-reduce per iteration), as DDP's flag.
        broadcast_buffers: copy rank 0's buffers (BatchNorm statistics) to all ranks
            before every forward, as DDP does.
        trace: record a measured timeline (:meth:`timeline`, :meth:`gather_timeline`).
        use_torch_ddp: with ``plan="ddp"``, run PyTorch's DDP (default) rather than
            the executor with the ``ddp`` planner's buckets.
        ddp_kwargs: extra arguments for PyTorch's DDP (``bucket_cap_mb`` ...).
        ranks_per_node: ranks per node for ``hier-allreduce`` operations: the group's ranks form nodes
            of this many consecutive group ranks (default: ``LOCAL_WORLD_SIZE``, which torchrun sets,
            else 1); checked at start-up to be the same on every rank (docs/runtime.md).
        shard_optimizer: shard the optimizer state over the ranks (ZeRO-1), the optimizer wrapped in
            :class:`~gradsched.torch.DistributedOptimizer` keeping its class and settings: over a plan of
            reduce-scatters (``dear``) each rank steps its reduced shard and the updated parameters are
            gathered before each layer's next forward (``ShardedOptimizer``); over any other plan PyTorch's
            ``ZeroRedundancyOptimizer`` steps in ``step()`` (:mod:`gradsched.torch.runtime.sharded`).
        sparse_options: how top-k operations run (:class:`gradsched.torch.runtime.sparse.SparseOptions` or a
            dict: ``warmup_steps``, ``selection``, ``error_feedback``, ``memory``); see docs/sparse.md.
    """

    _progress_thread = True  # plans with a credit window run a progress thread (until stop_progress_thread())

    def __init__(self, module: nn.Module, plan: str | Plan | None = None, *,
                 process_group: dist.ProcessGroup | None = None, profile: Profile | None = None,
                 cluster: Cluster | None = None, plan_options: dict[str, Any] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, find_unused_parameters: bool = False,
                 broadcast_buffers: bool | None = None, trace: bool = False, use_torch_ddp: bool = True,
                 ddp_kwargs: dict[str, Any] | None = None,
                 sparse_options: dict[str, Any] | Any | None = None, ranks_per_node: int | None = None,
                 shard_optimizer: bool = False,
                 device_ids: list[int | torch.device] | None = None, output_device: int | torch.device | None = None,
                 dim: int = 0, init_sync: bool = True, bucket_cap_mb: float | None = None,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 device_mesh: Any = None, **more_ddp_args: Any) -> None:
        # long function: checks DDP's arguments and sets up each feature in the order they depend on each other
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise GradschedError("torch.distributed is not initialised: call torch.distributed.init_process_group() "
                                 "(or launch with torchrun) before wrapping the model")
        timeout_s = check_timeout_s(timeout_s)  # finite: inf waited for ever, then blamed a dead peer
        check_module(module)
        plan, device_ids = split_positional(plan, device_ids)
        ddp_args = {"device_ids": device_ids, "output_device": output_device, "dim": dim, "init_sync": init_sync,
                    "bucket_cap_mb": bucket_cap_mb, "check_reduction": check_reduction,
                    "gradient_as_bucket_view": gradient_as_bucket_view, "static_graph": static_graph,
                    "device_mesh": device_mesh, **more_ddp_args}
        args = resolve(module, ddp_args, process_group=process_group, find_unused_parameters=find_unused_parameters,
                       broadcast_buffers=broadcast_buffers)
        plan, plan_options, use_torch_ddp = plan_choice(plan, plan_options, use_torch_ddp, args.bucket_cap_mb)
        self.module = module
        self._group = args.group
        self._world = dist.get_world_size(self._group)
        self._rank = dist.get_rank(self._group)
        self._timeout_s = float(timeout_s)
        self._broadcast_buffers = args.forward_sync_buffers
        self._input_device = args.input_device
        self._compiled = is_compiled(module)
        named = trainable_parameters(module)
        if profile is not None:
            named = in_profile_order(named, profile)  # plans index tensors in the profile's order
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._optimizer: UpdateLink | None = None
        self._executor: Executor | None = None
        self._ddp: nn.Module | None = None
        # deferred run-time auto on its baseline (PyTorch's DDP, untraced): the forward's thin pass-through to it
        object.__setattr__(self, "_baseline_ddp", None)
        self._ctrl: dist.ProcessGroup | None = None
        self._gate: ForwardGate | None = None  # overlapping plans: updates applied at each parameter's first use
        self._sparse_options = sparse_options
        shard_optimizer = check("DistributedDataParallel: shard_optimizer", SHARD_OPTIMIZER, shard_optimizer)
        self._shard_optimizer = shard_optimizer
        self.autotuner: AutoTuner | None = None
        self._ddp_pool: TorchDDPPool | None = None  # run-time auto's PyTorch-DDP candidates (torch_ddp)
        self._ddp_cap_mb = args.bucket_cap_mb or DDP_DEFAULT_MB  # DDP's bucket size as the user set it (DDP's default)
        self._ddp_cap_given = args.bucket_cap_mb is not None
        settings = startup_settings(module, self._group, args, plan_options)
        settings["shard_optimizer"] = str(shard_optimizer)  # ranks that disagree would wait in different collectives
        tune: AutoTuneConfig | None = None
        if isinstance(plan, str) and plan == "auto":
            # Run-time auto (gradsched.torch.runtime.autotune): start on the safe default, switch later.
            tune = AutoTuneConfig.from_options(plan_options)
            if tune.adaptive:  # the initial plan runs on the executor, traced (initial="ddp": DDP's buckets there)
                plan, plan_options, use_torch_ddp = tune.initial, tune.initial_options or None, False
            else:
                plan_options = {**tune.planner_options} or None
                tune = None
        self._user_trace = trace
        self._tracer = Tracer(self._rank) if trace or tune is not None else None

        self._user_ddp_kwargs = dict(ddp_kwargs or {})
        self._find_unused_arg = find_unused_parameters
        given, kw = self._make_plan(plan, plan_options, profile, cluster, use_torch_ddp,
                                    {**args.torch_ddp_kwargs, **(ddp_kwargs or {})}, settings)
        bad_nodes = self._resolve_ranks_per_node(ranks_per_node, tune is not None, settings)
        check_consistency(settings, self._group, self._timeout_s)
        if bad_nodes is not None:  # every rank has the same bad value: each says so
            raise bad_nodes
        if self._tracer is not None:
            self._tracer.reset_epoch()  # right after a collective: the ranks' clocks line up

        if self.plan is None:
            self._start_torch_ddp(kw, find_unused_parameters)
        else:
            self._start_runtime(args, tune, given)
        claim(module, self)  # wrapping it again is refused (its gradients would be reduced twice)

    def _resolve_ranks_per_node(self, explicit: int | None, tuned: bool,
                                settings: dict[str, str]) -> GradschedError | None:
        """Set ``self._ranks_per_node`` and its start-up setting; return (not raise) a bad value's error.

        Ranks per node change which collectives run where a plan has hier-allreduce operations (now, or
        after a switch by run-time auto): checked then, "-" elsewhere (every rank records the same keys).
        A bad value (e.g. ``LOCAL_WORLD_SIZE`` on one rank) is recorded as ``invalid`` and raised after
        the check, so that the other ranks fail at once too instead of waiting for this one."""
        nodes_matter = self.plan is not None and (tuned or uses_nodes(self.plan))
        self._ranks_per_node = 1
        try:
            if nodes_matter or explicit is not None:
                self._ranks_per_node = resolve_ranks_per_node(explicit)
        except GradschedError as exc:
            settings["ranks_per_node"] = "invalid"
            return exc
        settings["ranks_per_node"] = str(self._ranks_per_node) if nodes_matter else "-"
        return None

    def _make_plan(self, plan: str | Plan, plan_options: dict[str, Any] | None, profile: Profile | None,
                   cluster: Cluster | None, use_torch_ddp: bool, kw: dict[str, Any],
                   settings: dict[str, str]) -> tuple[tuple[Profile, Cluster] | None, dict[str, Any]]:
        """Set ``self.plan`` (``None`` for PyTorch's DDP), its issue order and its entry in ``settings``;
        return the user's (profile, cluster) if both were given (run-time auto's trials) and DDP's kwargs."""
        own_profile = profile_from_module(self.module, order=self._names)
        if profile is not None and profile.fingerprint != own_profile.fingerprint:
            raise GradschedError(f"the profile (model {profile.model!r}) does not describe this module's trainable "
                                 "parameters (their sizes differ); profile this module")
        both_given = profile is not None and cluster is not None
        profile = profile or own_profile
        self._own_profile = own_profile
        cluster = cluster.at_world_size(self._world) if cluster is not None else default_cluster(self._world)
        given = (profile, cluster) if both_given else None
        if isinstance(plan, str) and plan == "ddp" and use_torch_ddp:
            self.plan: Plan | None = None
            self.strategy = "ddp"
            settings["plan"] = plan_key("torch-ddp", repr(sorted(kw.items(), key=lambda kv: kv[0])))
            return given, kw
        self.plan = resolve_plan(plan, profile, cluster, plan_options)
        self.strategy = self.plan.strategy
        self._order = issue_order(self.plan, profile, cluster)
        settings["plan"] = plan_key(self.plan.strategy, f"{self.plan.hash} {self._order}")
        if any(op.sparse for op in self.plan.operations):
            from gradsched.torch.runtime.sparse import SparseOptions

            settings["sparse"] = repr(SparseOptions.of(self._sparse_options).to_dict())
        return given, kw

    def _start_torch_ddp(self, kw: dict[str, Any], find_unused_parameters: bool) -> None:
        """``plan="ddp"``: PyTorch's own DDP, with every DDP argument the user gave."""
        from torch.nn.parallel import DistributedDataParallel as TorchDDP

        kw.pop("device_mesh", None)  # its group is self._group
        ddp = TorchDDP(self.module, process_group=self._group, find_unused_parameters=find_unused_parameters, **kw)
        object.__setattr__(self, "_ddp", ddp)  # not a submodule: state_dict keys stay "module.*"
        self._deadline_due = True  # its failures as CollectiveError after timeout_s: hooked at the first forward

    def _start_runtime(self, args: DDPArgs, tune: AutoTuneConfig | None,
                       given: tuple[Profile, Cluster] | None) -> None:
        """After the start-up check: rank 0's state everywhere, side groups, the executor (and auto)."""
        if tune is not None:  # every rank alike (the check vouched for the options): each refuses at once
            tune.check_cluster(given[1] if given is not None else None)
        module, timeout_s = self.module, self._timeout_s
        if args.init_sync:
            tensors = list(module.parameters()) + (list(module.buffers()) if args.init_sync_buffers else [])
            broadcast_tensors(tensors, dist.get_global_rank(self._group, 0), self._group, timeout_s,
                              "the start-up copy of rank 0's parameters and buffers")
        if args.find_unused or (self._broadcast_buffers and any(True for _ in module.buffers())):
            # Side traffic (used flags, buffers) on its own group, so that it never
            # interleaves with the plan's collectives, which may still be in flight.
            self._ctrl = side_group(self._group, timeout_s)
        if tune is not None and not is_whole_world(self._group):
            private_group(self._group, timeout_s, self)  # now, while the start-up check vouches for the group count
        self._find_unused = args.find_unused
        if tune is not None and tune.torch_ddp:
            self._ddp_pool = TorchDDPPool(module, self._group, {**args.torch_ddp_kwargs, **self._user_ddp_kwargs},
                                          self._find_unused_arg, self._broadcast_buffers)
        if tune is None or not tune.deferred:  # deferred: built when profiling starts (PyTorch's DDP until then)
            self._start_executor()
        else:  # no executor to arm the exit's cycle collection: this wrapper's cycles hold its process groups
            shutdown.collect_at_exit()
        if tune is not None:
            assert self._tracer is not None
            self.strategy = "auto"
            self.autotuner = AutoTuner(self._tuned_model(), tune, self._tracer, keep_events=self._user_trace,
                                       offline=given)
            if self.autotuner.before_profiling and not self._user_trace and self._ddp is not None:
                object.__setattr__(self, "_baseline_ddp", self._ddp)  # until the next switch (_switch_plan)

    def _tuned_model(self) -> TunedModel:
        """What run-time ``auto`` sees of this wrapper (:class:`~gradsched.torch.runtime.autotune.TunedModel`)."""
        return TunedModel(group=self._group, world=self._world, rank=self._rank, device=self._params[0].device,
                          profile=self._own_profile, plan=lambda: self.plan, order=lambda: self._order,
                          switch_plan=self._switch_plan, synchronize=self.synchronize,
                          has_optimizer=lambda: self._optimizer is not None, timeout_s=self._timeout_s,
                          ddp_bucket_cap_mb=self._ddp_cap_mb, ddp_cap_given=self._ddp_cap_given,
                          release_spares=self._release_spare_ddps)

    def _start_executor(self) -> None:
        """Build the executor (and forward gating) for ``self.plan`` and ``self._order``."""
        assert self.plan is not None
        plan, order = executable(self.plan, self._order)  # a reduce-scatter's runner also gathers
        self._executor = Executor(self._params, self._names, plan, order, self._group,
                                  self._ctrl or self._group, timeout_s=self._timeout_s,
                                  find_unused_parameters=self._find_unused, tracer=self._tracer,
                                  sparse_options=self._sparse_options, private_owner=self,
                                  ranks_per_node=self._ranks_per_node, progress_thread=self._progress_thread)
        # its hooks keep it alive, and it this wrapper: the claim on the parameters (misuse.claim) lasts as they do
        self._executor.wrapper = self
        if self._optimizer is not None:
            self._executor.mirror = self._optimizer.on_arrival  # sparse results update their weights on arrival
        if self.overlaps_forward:
            # in flight past backward only with a DistributedOptimizer (gradsched.torch.runtime.inflight)
            self._executor.on_backward_end = functools.partial(inflight.on_backward_end, self.link)
            self._gate = ForwardGate(self.module, self._params, lambda: self._optimizer)

    def _switch_plan(self, plan: Plan, order: list[int]) -> None:
        """Run ``plan`` from the next backward on.  Call on every rank at the same iteration
        boundary; outstanding communication and updates are finished first, so the
        numbers computed do not change (``gradsched.torch.runtime.autotune`` uses it)."""
        self.synchronize()
        object.__setattr__(self, "_baseline_ddp", None)  # the thin forward runs the baseline alone
        if self._ddp_pool is not None and self.plan is not None and is_torch_ddp(self.plan):
            self._ddp_pool.park(self.plan.options["bucket_cap_mb"], self._params)  # its buckets, until it runs again
        enabled = self._sync_enabled
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._gate is not None:
            self._gate.remove()
            self._gate = None
        if self._params and self._params[0].device.type == "cpu":
            trim_heap()  # the outgoing plan's buckets (freed, or parked) back to the system, not left as holes
        self.plan, self._order = plan, list(order)
        if is_torch_ddp(plan):  # PyTorch's own DDP (run-time auto's candidate): kept across windows
            assert self._ddp_pool is not None
            object.__setattr__(self, "_ddp", self._ddp_pool.get(plan.options["bucket_cap_mb"],
                                                                plan.options.get("default", False)))
            self._ddp.require_backward_grad_sync = enabled
            return
        object.__setattr__(self, "_ddp", None)
        self._start_executor()
        self._executor.enabled = enabled

    def _release_spare_ddps(self) -> None:
        """Drop the PyTorch DDPs run-time auto kept for its trials, but the one running."""
        if self._ddp_pool is not None:
            self._ddp_pool.release(self.plan.options["bucket_cap_mb"] if is_torch_ddp(self.plan) else None)

    @property
    def _sync_enabled(self) -> bool:
        """Gradients are averaged in backward (False inside ``no_sync()``)."""
        if self._executor is not None:
            return self._executor.enabled
        return self._ddp is None or self._ddp.require_backward_grad_sync  # neither yet: deferred auto's start

    # ------------------------------------------------------------------ start-up
    @property
    def link(self) -> ModelLink:
        """This wrapper as its optimizer, the in-flight guard and integrations see it
        (:class:`~gradsched.torch.runtime.link.ModelLink`): the one way they reach its state."""
        return _Link(self)

    def _attach_optimizer(self, optimizer: UpdateLink, inner: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self._optimizer is not None and self._optimizer is not optimizer:
            raise GradschedError("this model already has a DistributedOptimizer; wrap one optimizer per model")
        mine = {id(p) for p in self._params}
        theirs = {id(p) for g in inner.param_groups for p in g["params"]}
        if self.overlaps_forward and not theirs <= mine | {id(p) for p in self.module.parameters()}:
            raise GradschedError("the optimizer holds parameters that are not this model's; build it over "
                                 "model.parameters()")
        if self._shard_optimizer:
            inner = self._sharded(inner)
        self._optimizer = optimizer
        if self._executor is not None:
            self._executor.mirror = optimizer.on_arrival  # sparse results update their weights on arrival
        return inner

    def _sharded(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``shard_optimizer=True``: over a plan of reduce-scatters alone (``dear``, no run-time auto) the
        optimizer steps the reduce-scatters' shards and gathers parameters before each layer's forward
        (ShardedOptimizer); over any other plan, all-reduced gradients and PyTorch's ZeroRedundancyOptimizer."""
        ex = self._executor
        if (ex is None or self.autotuner is not None or not ex.runners
                or not all(isinstance(r, DecoupledAllReduce) for r in ex.runners)
                or not all(p.is_contiguous() for p in self._params)):
            return shard(optimizer, self._group)
        sharded = ShardedOptimizer(optimizer, ex, self._group)
        if self._gate is None:  # each layer's forward waits for its own parameters' gather
            self._gate = ForwardGate(self.module, self._params, lambda: self._optimizer)
        return sharded

    # ------------------------------------------------------------------ properties
    @property
    def overlaps_forward(self) -> bool:
        """Does the update of a parameter wait only for its own gradients, before its next forward?
        (An overlapping plan without a sharded optimizer, whose step is one synchronous call.)"""
        return self.plan is not None and self.plan.overlap_forward and not self._shard_optimizer

    @property
    def world_size(self) -> int:
        return self._world

    # ------------------------------------------------------------------ training
    @torch._disable_dynamo(recursive=False)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # torch.compile of the wrapper compiles what this calls (the module, or the module under
        # PyTorch's DDP) and none of this bookkeeping, as PyTorch's DDP keeps its own forward out
        # of dynamo: traced, it guarded on the tracer's iteration counter and recompiled every step
        # until dynamo's limit (docs/integrations.md, "torch.compile").
        compiling = _compiling()
        if self._baseline_ddp is not None and not compiling:
            out = self._baseline_forward(self._baseline_ddp, args, kwargs)
            if out is not _SWITCHED:
                return out
            run, args, kwargs, t0 = self._before_run(args, kwargs, compiling)  # profiling starts at this iteration
        else:
            run, args, kwargs, t0 = self._before_forward(args, kwargs, compiling)
        if run is self._ddp:
            out = self._run_ddp(run, args, kwargs)
        else:
            with self._gate.first_use() if self._gate is not None else contextlib.nullcontext():
                out = run(*args, **kwargs)  # pending updates applied at each parameter's first read
        self._after_forward(out, t0)
        return out

    def _baseline_forward(self, ddp: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Deferred run-time auto on its baseline: PyTorch's DDP behind a thin pass-through (a job too short
        to profile pays for the wrapper no more than a counter, the tuner's clock and one re-arm hook).
        What :meth:`_before_forward` and :meth:`_after_forward` do there, in plain code: no dynamo guards
        (the wrapper is not being compiled), no trace span (nothing reads the baseline's).  Returns
        :data:`_SWITCHED` where the tuner leaves the baseline at this iteration (profiling starts): the
        iteration boundary is counted, the rest of the forward is the full one."""
        assert self._tracer is not None and self.autotuner is not None
        self._tracer.iteration += 1  # Tracer.next_iteration
        if torch.is_grad_enabled() and ddp.require_backward_grad_sync:  # _sync_enabled: no executor yet
            self.autotuner.on_iteration_start()  # an iteration boundary: profiling may start here
            if self._baseline_ddp is not ddp:
                return _SWITCHED
        try:  # no bucket bookkeeping here (_run_ddp, _note_ddp_buckets): its buckets are seen once it takes turns
            out = ddp(*args, **kwargs)
        except Exception as exc:  # a failure of DDP's forward collectives (buffer broadcast)
            failure = self._ddp_forward_failure(exc)
            if failure is exc:
                raise
            raise failure from exc
        reduce_every_backward(ddp, out, self._find_unused_arg)  # every backward averaged, as under the executor
        return out

    def _run_ddp(self, ddp: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """PyTorch DDP's forward; run-time auto's DDP without the buckets it replaces if it rebuilds them there
        (:meth:`TorchDDPPool.rebuilding`)."""
        pool, plan = self._ddp_pool, self.plan
        rebuild = (pool.rebuilding(plan.options["bucket_cap_mb"], self._params)
                   if pool is not None and plan is not None and is_torch_ddp(plan) and torch.is_grad_enabled()
                   else contextlib.nullcontext())
        try:
            with rebuild:
                return ddp(*args, **kwargs)
        except Exception as exc:  # a failure of DDP's forward collectives (buffer broadcast)
            failure = self._ddp_forward_failure(exc)
            if failure is exc:
                raise
            raise failure from exc

    @torch._disable_dynamo
    def _before_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                        compiling: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any], float | None]:
        """Everything before the module's forward: what to call with which inputs, and the forward's start
        time (``None``: not traced).  ``compiling``: the wrapper itself is being compiled."""
        if self._ddp is not None and (self.autotuner is None or self._settled_on_torch_ddp()):
            self._install_ddp_deadline()
            return self._ddp, args, kwargs, None
        tracer = self._tracer
        if tracer is not None:
            tracer.next_iteration()
        if self.autotuner is not None and torch.is_grad_enabled() and self._sync_enabled:
            self.autotuner.on_iteration_start()  # an iteration boundary: the plan may switch here
        return self._before_run(args, kwargs, compiling)

    @torch._disable_dynamo
    def _before_run(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                    compiling: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any], float | None]:
        """:meth:`_before_forward` after the iteration boundary (the plan this iteration runs is known)."""
        tracer = self._tracer
        if self._ddp is not None:  # run-time auto runs PyTorch's DDP (a candidate, or what it settled on)
            # deferred, on the baseline: nothing reads its forward's span (profiling starts afresh)
            quiet = tracer is None or (self.autotuner is not None and self.autotuner.before_profiling
                                       and not self._user_trace)
            return self._ddp, args, kwargs, None if quiet else tracer.now()
        t0 = tracer.now() if tracer is not None else None
        if self._input_device is not None:  # device_ids=[d]: inputs go to d, as DDP moves them
            args, kwargs = to_device(args, self._input_device), to_device(kwargs, self._input_device)
        syncing = torch.is_grad_enabled() and self._executor is not None and self._executor.enabled
        self._finish_unstepped()
        if self._broadcast_buffers and self._ctrl is not None and syncing:
            self._sync_buffers()
        if (self._compiled or compiling) and self._optimizer is not None and self._optimizer.pending:
            # A compiled module runs its layers as one graph, with no per-layer gate in between:
            # its parameters must all be updated before it starts (docs/integrations.md).
            self._optimizer.flush()
        return self.module, args, kwargs, t0

    @torch._disable_dynamo
    def _after_forward(self, out: Any, t0: float | None) -> None:
        """Everything after the module's forward: hooks on its output, updates it did not reach, the trace."""
        if self._ddp is not None:
            if self.autotuner is not None:  # auto's DDP: every backward averaged, as under the executor
                reduce_every_backward(self._ddp, out, self._find_unused_arg)
                self._note_ddp_buckets(out)
        else:
            ex = self._executor
            if torch.is_grad_enabled() and ex is not None and ex.enabled and ex.laysa and ex.mirror is not None:
                inflight.refuse_second_backward(ex, out)  # the weights change during its backward
        if self._ddp is None and self._optimizer is not None and self._optimizer.pending:
            self._optimizer.flush()  # parameters the forward did not reach
        if t0 is not None and self._tracer is not None:
            self._tracer.span("forward", FORWARD, t0)

    def _note_ddp_buckets(self, out: Any) -> None:
        """Run-time auto on one of its PyTorch DDPs: where the pool has not seen that DDP's buckets yet, it
        notes them at the end of this forward's backward, to release them while another plan runs
        (:meth:`TorchDDPPool.park`)."""
        pool, plan = self._ddp_pool, self.plan
        if pool is None or plan is None or not torch.is_grad_enabled():
            return
        cap = plan.options["bucket_cap_mb"]
        if pool.wants_buckets(cap):
            params = self._params
            after_backward(out, lambda: pool.note_buckets(cap, params))

    def _install_ddp_deadline(self) -> None:
        """The deadline hook on PyTorch's DDP (``plan="ddp"``), after any hook of the user's (the Lightning
        strategy's)."""
        if getattr(self, "_deadline_due", False):
            ddp_errors.install(self._ddp, self._group, self._timeout_s)
            self._deadline_due = False

    def _ddp_forward_failure(self, exc: Exception) -> Exception:
        """A failure of PyTorch DDP's forward: a CollectiveError where the backend failed, else ``exc``."""
        if not ddp_errors.is_backend_failure(exc):
            return exc
        return ddp_errors.collective_error(self._rank, "PyTorch DDP's forward collectives", self._timeout_s, exc)

    def hooks_parameters(self) -> bool:
        """Whether this wrapper's gradient hooks are on its parameters: PyTorch's DDP's, or an executor's
        not closed (:mod:`gradsched.torch.runtime.misuse` refuses a second wrapper over them)."""
        if self._ddp is not None or self._ddp_pool is not None:
            return True
        return self._executor is not None and self._executor.hooked

    def backward_outstanding(self) -> bool:
        """Whether a backward ran on gradsched's executor since its start or the last plan switch (its
        operations' results are what a deferred ``step()`` waits for)."""
        ex = self._executor
        return ex is not None and (ex.in_backward or any(s != PENDING for s in ex.op_state))

    def _settled_on_torch_ddp(self) -> bool:
        """Run-time auto settled on PyTorch's DDP for good (and no trace was asked for): its forward alone runs."""
        return self.autotuner is not None and self.autotuner.done and not self._user_trace

    @property
    def step_tracer(self) -> Tracer | None:
        """Where the optimizer records its updates: nowhere once run-time auto settled on PyTorch's DDP (nothing
        reads them then, and nothing trims them: one event a step would pile up for the rest of training)."""
        return None if self._settled_on_torch_ddp() else self._tracer

    def _finish_unstepped(self) -> None:
        """A backward left in flight that no ``step()`` followed (a GAN's generator step through the
        discriminator): finish it now, before autograd accumulates into its buckets."""
        ex = self._executor
        if ex is None:
            return
        if ex.laysa:
            inflight.clear_applied(self._params)  # autograd cannot accumulate into the stand-ins
        if not ex.settled and not (self._optimizer is not None and self._optimizer.pending):
            inflight.wait_all(ex)

    def _sync_buffers(self) -> None:
        """Rank 0's buffers to every rank, on the side-traffic group."""
        broadcast_buffers(self.module, self._ctrl, dist.get_global_rank(self._group, 0), self._timeout_s)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside this block, as DDP's ``no_sync``."""
        if self._ddp is not None:
            with self._ddp.no_sync():
                yield
            return
        assert self._executor is not None
        old = self._executor.enabled
        self._executor.enabled = False
        try:
            yield
        finally:
            self._executor.enabled = old

    def synchronize(self) -> None:
        """Finish all communication and deferred updates (before evaluating, saving or exiting)."""
        if self._optimizer is not None:
            self._optimizer.flush()
        if self._executor is not None and not self._executor.settled:
            self._executor.settle_all()

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.synchronize()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        if assign:
            raise GradschedError("load_state_dict(assign=True) would replace the parameters the runtime hooks; "
                                 "load with assign=False")
        self.synchronize()
        return super().load_state_dict(state_dict, strict=strict)

    # sparse plans: residuals and the step counter travel in the state_dict (prefix "_gradsched_sparse.")
    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._executor is not None:
            for k, v in self._executor.sparse_state().items():
                destination[f"{prefix}{_SPARSE_KEY}.{k}"] = v

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        mine = f"{prefix}{_SPARSE_KEY}."
        sparse = {k[len(mine):]: state_dict.pop(k) for k in [k for k in state_dict if k.startswith(mine)]}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        needed = self._executor.sparse_state() if self._executor is not None else {}
        if sparse or needed:
            if not sparse:  # e.g. a dense checkpoint: missing keys (strict=False starts with empty residuals)
                missing_keys.extend(f"{mine}{k}" for k in sorted(needed))
                return
            if not needed:
                error_msgs.append(self._no_topk_operations(sparse))
                return
            self._executor.load_sparse_state(sparse)  # refuses another plan's or another rank's residuals

    def gathered_state_dict(self) -> dict[str, Any]:
        """``state_dict()`` with every rank's top-k residuals gathered into one whole: a collective, call
        it on every rank and let rank 0 save it.  Loaded on every rank, it restores each rank's own
        residuals (a plain ``state_dict()`` holds the saving rank's alone and is refused on other ranks)."""
        state = self.state_dict()
        state.update(self.sparse_state_dict())
        return state

    def sparse_state_dict(self) -> dict[str, Any]:
        """What :meth:`gathered_state_dict` adds to ``state_dict()``: every rank's top-k residuals and
        the sparse step counter (a collective; empty without top-k operations), for frameworks
        that save the module's weights themselves (:mod:`gradsched.lightning`)."""
        if self._executor is None:
            return {}
        self.synchronize()
        return {f"{_SPARSE_KEY}.{k}": v for k, v in self._executor.gathered_sparse_state().items()}

    def load_sparse_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`sparse_state_dict` on every rank (each takes its own residuals); refused
        with a message under another plan, another world size or a plan without top-k operations."""
        prefix = f"{_SPARSE_KEY}."
        sparse = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not sparse:
            return
        if self._executor is None or not self._executor.sparse_state():
            raise GradschedError(self._no_topk_operations(sparse))
        self.synchronize()
        self._executor.load_sparse_state(sparse)

    def _no_topk_operations(self, sparse: dict[str, Any]) -> str:
        return (f"the checkpoint holds sparse state (residuals: {sorted(sparse)}) but this plan {self.strategy!r} has "
                "no top-k operations; load it under the plan that saved it")

    def host_timer(self) -> HostTimer | None:
        """Start (or keep) counting the runtime's host time per operation; ``None`` under PyTorch's DDP.

        The bench's measure of what issuing and retiring an operation costs the training
        thread (:mod:`gradsched.torch.runtime.hosttime`).  Counts until the plan changes."""
        if self._executor is None:
            return None
        if self._executor.host_timer is None:
            self._executor.host_timer = HostTimer()
        return self._executor.host_timer

    def stop_progress_thread(self) -> None:
        """Stop the executor's progress thread (plans with a credit window: ``bytescheduler``), for this
        plan and every later one (run-time auto's): operations then go at hooks and waits alone, as
        before the thread existed (docs/runtime.md, "Progress thread").  Nothing to stop elsewhere."""
        self._progress_thread = False
        if self._executor is not None:
            self._executor.stop_progress_thread()

    def unfinished_bytes(self) -> tuple[int, int] | None:
        """(bytes of the plan's operations not yet complete, bytes the plan moves) for the last backward:
        read when ``step()`` returns, what is left to overlap the next forward; ``None`` under PyTorch's DDP."""
        return self._executor.unfinished_bytes() if self._executor is not None else None

    def memory_stats(self) -> dict[str, int] | None:
        """Bytes of the runtime's own buffers (live, peak; docs/sparse.md); ``None`` under PyTorch's DDP."""
        return self._executor.ledger.stats() if self._executor is not None else None

    # ------------------------------------------------------------------ tracing
    def timeline(self) -> Timeline:
        """This rank's measured timeline (``trace=True``)."""
        if self._tracer is None or not self._user_trace:
            raise GradschedError("tracing is off: wrap the model with trace=True")
        return self._tracer.timeline(self._trace_meta())

    def gather_timeline(self) -> Timeline:
        """Every rank's measured events in one Timeline (a collective: call it on every rank)."""
        self.synchronize()
        mine = self.timeline()
        everyone: list[Any] = [None] * self._world
        dist.all_gather_object(everyone, mine, group=self._group)
        return merge_timelines(everyone, {"label": f"{self.strategy} (measured)"})

    def _trace_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"strategy": self.strategy, "world_size": self._world, "rank": self._rank,
                                "label": f"{self.strategy} (measured, rank {self._rank})", "measured": True}
        if self.plan is not None:
            meta["plan_hash"] = self.plan.hash
            meta["operations"] = len(self.plan.operations)
        return meta



class _Link:
    """:class:`~gradsched.torch.runtime.link.ModelLink` of one wrapper (``model.link``): the members its
    partners use, read from the wrapper's state here, in its own module."""

    __slots__ = ("_model",)

    def __init__(self, model: DistributedDataParallel) -> None:
        self._model = model

    @property
    def params(self) -> list[nn.Parameter]:
        return self._model._params

    @property
    def names(self) -> list[str]:
        return self._model._names

    @property
    def strategy(self) -> str:
        return self._model.strategy

    @property
    def overlaps_forward(self) -> bool:
        return self._model.overlaps_forward

    @property
    def tracer(self) -> Tracer | None:
        return self._model._tracer

    @property
    def step_tracer(self) -> Tracer | None:
        return self._model.step_tracer

    @property
    def optimizer(self) -> UpdateLink | None:
        return self._model._optimizer

    @property
    def torch_ddp(self) -> nn.Module | None:
        return self._model._ddp

    def attach_optimizer(self, optimizer: UpdateLink, inner: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self._model._attach_optimizer(optimizer, inner)

    def backward_outstanding(self) -> bool:
        return self._model.backward_outstanding()

    def settle(self, tensors: list[int]) -> None:
        self._executor().settle(tensors)

    def settle_all(self) -> None:
        self._executor().settle_all()

    def settle_done(self) -> list[int]:
        return self._executor().settle_done()

    def finish_unstepped(self) -> None:
        self._model._finish_unstepped()

    def _executor(self) -> Executor:
        ex = self._model._executor
        if ex is None:  # deferred updates exist only under the executor
            raise InternalError("no executor to settle: the plan runs on PyTorch's DDP")
        return ex


def _compiling() -> bool:
    """Whether this frame runs under ``torch.compile`` (the wrapper compiled as a whole): dynamo's frame
    callback is set (it is not in eager code, nor inside a function dynamo is told to skip entirely)."""
    eval_frame = sys.modules.get("torch._C._dynamo.eval_frame")
    get = getattr(eval_frame, "get_eval_frame_callback", None)
    return get is not None and get() not in (None, False)


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule is compiled (``torch.compile(m)`` or ``m.compile()``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not loaded: nothing was compiled (saves its import)
    if eval_frame is None:
        return False
    return any(isinstance(m, eval_frame.OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None
               for m in module.modules())


def broadcast_buffers(module: nn.Module, group: dist.ProcessGroup | None, src: int, timeout_s: float) -> None:
    """Rank ``src``'s buffers (BatchNorm statistics) to every rank of ``group``: one broadcast per
    dtype (flattened), as DDP coalesces them.  A collective: every rank of ``group`` calls it."""
    rank = dist.get_rank()
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in module.buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for bufs in by_dtype.values():
        flat = torch.cat([b.detach().reshape(-1) for b in bufs])
        work = dist.broadcast(flat, src=src, group=group, async_op=True)
        try:
            work.wait(timeout=timedelta(seconds=timeout_s))
        except Exception as exc:
            raise CollectiveError(f"rank {rank}: buffer broadcast failed or timed out after "
                                  f"{timeout_s:g} s: a peer rank probably died ({exc})") from exc
        if rank != src:
            with torch.no_grad():
                offset = 0
                for b in bufs:
                    b.copy_(flat[offset:offset + b.numel()].view_as(b))
                    offset += b.numel()
