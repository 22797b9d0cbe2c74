"""gradsched's executor against PyTorch DDP on the same buckets, 8 gloo ranks on loopback: where the time goes.

    python benchmarks/runtime_overhead_8h.py [--profile benchmarks/profiles/bert-base-b64-10tflops.profile.json]
        [--scale 16] [--dilate 2.5] [--world 8] [--steps 6] [--rounds 3] [--rows torch-ddp,gs-ddp]
        [--json benchmarks/results/runtime_overhead_8h.json]

A replay of ``--profile`` at byte scale ``--scale`` (compute emulated: the profile's times x ``--dilate``),
ranks on loopback, no shaping.  Rows, each built once per rank, take turns in ``--rounds`` rounds of
``--steps`` steps (the first step of each burst not counted):

- ``torch-ddp``: PyTorch's DDP at ``bucket_cap_mb`` 25/S (the bench's ``ddp`` row);
- ``gs-ddp``: the ``ddp`` planner's buckets at the same size, run by gradsched's executor (the same
  all-reduces);
- ``gs-optimal``: the ``optimal`` plan for an 8-rank 10 Gbit/s cluster (as the bench's run-time auto tried);
  ``gs-NAME`` any strategy on gradsched's executor, ``bare-ddp``/``bare-optimal`` the same all-reduces on a bare
  hook runner (below).  A row may carry plan options: ``gs-usbyte:groups=0+unit_bytes=524288``, ``torch-ddp:mb=0.125``
  (a ddp row's bucket size; all ddp rows: ``--bucket-mb``), ``gs-usbyte:groups=0+threads=1`` (an overlapping
  plan's operations on a private group of one gloo thread: ``$GRADSCHED_OVERLAP_GLOO_THREADS``).

Each step starts with a barrier (``--burst``: each round's ``--steps`` back to back, timed together, so that an
overlapping plan's operations stay in flight into the next forward).  Per step and rank: wall time of the step,
of its backward and of its optimizer step; CPU of the training thread (``time.thread_time``) and of the whole
process (all threads,
gloo's included) per phase.  Reported per row: the median step of the slowest rank, and per-rank means.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PHASES = ("wall", "fwd", "bwd", "opt", "cpu_main", "cpu_proc", "bwd_main", "bwd_proc")


class BareRunner(torch.nn.Module):
    """A plan's all-reduces and nothing else: the floor for any runtime running that plan.

    Whole-tensor operations only (``ddp``, ``optimal``): one flat buffer per operation, every ``.grad`` a view
    into it; a post-accumulate-grad hook counts the operation's tensors down and issues, in plan order, every
    operation whose tensors are all in; the end of backward waits for all of them.  No tracing, no credit, no
    gates, no locks."""

    def __init__(self, module: Any, plan: Any) -> None:
        super().__init__()
        self.module = module
        self.plan = plan
        params = [p for p in module.parameters() if p.requires_grad]
        self.world = dist.get_world_size()
        self.bufs: list[torch.Tensor] = []
        self.views: list[torch.Tensor | None] = [None] * len(params)
        self.op_of = [0] * len(params)
        self.size = []
        for j, op in enumerate(plan.operations):
            n = sum(s.end - s.start for s in op.slices)
            buf = torch.zeros(n)
            pos = 0
            for s in op.slices:
                assert s.start == 0 and s.end == params[s.tensor].numel(), "whole tensors only"
                self.views[s.tensor] = buf[pos:pos + s.end].view_as(params[s.tensor])
                self.op_of[s.tensor] = j
                pos += s.end
            self.bufs.append(buf)
            self.size.append(len(op.slices))
        self.works: list[Any] = []
        self.left: list[int] = []
        self.next = 0
        self.active = False
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    def _hook(self, i: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            if not self.active:
                self.active, self.left, self.next, self.works = True, list(self.size), 0, []
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            view = self.views[i]
            assert view is not None
            if p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view
            self.left[self.op_of[i]] -= 1
            while self.next < len(self.bufs) and self.left[self.next] == 0:
                buf = self.bufs[self.next]
                buf.div_(self.world)
                self.works.append(dist.all_reduce(buf, async_op=True))
                self.next += 1
        return hook

    def _finish(self) -> None:
        for w in self.works:
            w.wait()
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def synchronize(self) -> None:
        pass


def row_options(row: str) -> tuple[str, dict[str, Any]]:
    """``"gs-usbyte:groups=0+unit_bytes=524288"`` -> ``("gs-usbyte", {"groups": 0, "unit_bytes": 524288})``: a row's
    name and its plan options (values read as JSON, else kept as text); ``mb=X`` sets a ddp row's bucket size."""
    name, _, rest = row.partition(":")
    opts: dict[str, Any] = {}
    for item in filter(None, rest.split("+")):
        key, _, value = item.partition("=")
        try:
            opts[key] = json.loads(value)
        except ValueError:
            opts[key] = value
    return name, opts


def build(row: str, prof: Any, cluster: Any, bucket_mb: float) -> tuple[Any, Any]:
    import gradsched.torch as gt
    from gradsched.torch.jobs.replay import ReplayModel
    from gradsched.torch.runtime.executor import OVERLAP_THREADS_ENV
    from gradsched.torch.runtime.optim import DistributedOptimizer
    from gradsched.torch.runtime.planning import resolve_plan

    name, opts = row_options(row)
    bucket_mb = float(opts.pop("mb", bucket_mb))
    # threads=N: an overlapping plan's operations on a private group of N gloo threads (the executor's switch)
    threads = opts.pop("threads", None)
    os.environ[OVERLAP_THREADS_ENV] = "" if threads is None else str(threads)
    torch.manual_seed(0)
    m = ReplayModel(prof)
    if name.startswith("bare-"):
        strategy = name.removeprefix("bare-")
        plan_opts = {"bucket_cap_mb": bucket_mb} if strategy == "ddp" else (opts or None)
        b = BareRunner(m, resolve_plan(strategy, prof, cluster, plan_opts))
        return b, torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    common = {"profile": prof, "cluster": cluster, "init_sync": False, "gradient_as_bucket_view": True,
              "timeout_s": 300}
    if name == "torch-ddp":
        w = gt.DistributedDataParallel(m, "ddp", ddp_kwargs={"bucket_cap_mb": bucket_mb}, **common)
    elif name == "gs-ddp":
        w = gt.DistributedDataParallel(m, "ddp", use_torch_ddp=False, bucket_cap_mb=bucket_mb, **common)
    else:
        w = gt.DistributedDataParallel(m, name.removeprefix("gs-"), use_torch_ddp=False, plan_options=opts or None,
                                       **common)
    opt = DistributedOptimizer(torch.optim.SGD(w.parameters(), lr=1e-3, momentum=0.9), w)
    return w, opt


def timed_steps(m: Any, opt: Any, steps: int, skip_compute: bool) -> dict[str, list[float]]:
    from gradsched.torch.jobs.replay import fast_forward, restart_clocks

    out: dict[str, list[float]] = {k: [] for k in PHASES}
    x = torch.ones(4, 8)
    restart_clocks(m.module if hasattr(m, "module") else m)
    ctx = fast_forward(m) if skip_compute else contextlib.nullcontext()
    with ctx:
        for s in range(steps + 1):
            dist.barrier()
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            opt.zero_grad()
            y = m(x)
            t1 = time.perf_counter()
            c1, p1 = time.thread_time(), time.process_time()
            y.sum().backward()
            t2 = time.perf_counter()
            c2, p2 = time.thread_time(), time.process_time()
            opt.step()
            m.synchronize()
            t3, c3, p3 = time.perf_counter(), time.thread_time(), time.process_time()
            if s >= 1:
                for k, v in (("wall", t3 - t0), ("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2),
                             ("cpu_main", c3 - c0), ("cpu_proc", p3 - p0), ("bwd_main", c2 - c1),
                             ("bwd_proc", p2 - p1)):
                    out[k].append(v)
    return out


def burst_steps(m: Any, opt: Any, steps: int) -> dict[str, list[float]]:
    """One burst: a synchronised step, a barrier, then ``steps`` steps back to back and a final synchronize;
    ``wall`` is the burst's time per step.  No barrier or synchronize between its steps, so an overlapping
    plan's operations stay in flight into the next forward, as in training (``timed_steps`` synchronizes
    every step, which waits them out before the next forward)."""
    from gradsched.torch.jobs.replay import restart_clocks

    x = torch.ones(4, 8)
    restart_clocks(m.module if hasattr(m, "module") else m)
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
    m.synchronize()
    dist.barrier()
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    for _ in range(steps):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
    m.synchronize()
    t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
    out: dict[str, list[float]] = {k: [0.0] for k in PHASES}
    out.update(wall=[(t1 - t0) / steps], cpu_main=[(c1 - c0) / steps], cpu_proc=[(p1 - p0) / steps])
    return out


def worker(rank: int, world: int, args: argparse.Namespace, prof: Any, cluster: Any) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    names = args.rows.split(",")
    bucket_mb = args.bucket_mb if args.bucket_mb > 0 else 25 / args.scale
    rows = {c: build(c, prof, cluster, bucket_mb) for c in names}
    for m, opt in rows.values():  # warm-up: DDP rebuilds its buckets, first allocations
        timed_steps(m, opt, 2, skip_compute=True)
    res: dict[str, dict[str, list[float]]] = {c: {} for c in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for c in order:
            m, opt = rows[c]
            steps = (burst_steps(m, opt, args.steps) if args.burst
                     else timed_steps(m, opt, args.steps, args.skip_compute))
            for k, v in steps.items():
                res[c].setdefault(k, []).extend(v)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, res)
    if rank == 0:
        summary = {}
        ops = {c: (len(rows[c][0].plan.operations) if getattr(rows[c][0], "plan", None) is not None else None)
               for c in names}
        for c in names:
            step = [max(a[c]["wall"][i] for a in everyone) for i in range(len(res[c]["wall"]))]
            per = {k: statistics.mean(statistics.median(a[c][k]) for a in everyone) for k in PHASES}
            summary[c] = {"step_s": statistics.median(step), "operations": ops[c],
                          **{f"{k}_s": v for k, v in per.items()}}
            print(f"{c:12s} ops {ops[c]}  step {1e3 * summary[c]['step_s']:7.1f} ms | per rank: fwd "
                  f"{1e3 * per['fwd']:6.1f} bwd {1e3 * per['bwd']:6.1f} opt {1e3 * per['opt']:6.1f} ms wall; CPU main "
                  f"{1e3 * per['cpu_main']:6.1f} (bwd {1e3 * per['bwd_main']:6.1f}) proc {1e3 * per['cpu_proc']:6.1f} "
                  f"(bwd {1e3 * per['bwd_proc']:6.1f}) ms", flush=True)
        if args.json:
            doc = {"command": " ".join(sys.argv), "load_average": os.getloadavg(), "world": world,
                   "profile": args.profile, "scale": args.scale, "dilate": args.dilate, "steps": args.steps,
                   "rounds": args.rounds, "bucket_mb": args.bucket_mb or 25 / args.scale, "alpha_s": args.alpha,
                   "skip_compute": args.skip_compute, "burst": args.burst, "tag": args.tag, "rows": summary}
            path = Path(args.json)
            runs = json.loads(path.read_text())["runs"] if path.exists() else []
            path.write_text(json.dumps({"runs": runs + [doc]}, indent=1) + "\n")
    dist.destroy_process_group()


def main() -> None:
    from gradsched.byte_scaling import scale_profile
    from gradsched.cluster import Cluster
    from gradsched.profile import Profile
    from gradsched.torch.jobs.replay import ReplayModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="benchmarks/profiles/bert-base-b64-10tflops.profile.json")
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--dilate", type=float, default=2.5)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="torch-ddp,gs-ddp")
    ap.add_argument("--bucket-mb", type=float, default=0.0,
                    help="the ddp rows' bucket_cap_mb (default 25 / --scale, the bench's ddp row)")
    ap.add_argument("--burst", action="store_true",
                    help="time each row's --steps back to back, per step, without a barrier between them")
    ap.add_argument("--alpha", type=float, default=2e-3, help="the planning cluster's start-up, seconds")
    ap.add_argument("--skip-compute", action="store_true", help="emulated compute skipped (communication alone)")
    ap.add_argument("--port", type=int, default=0, help="default: a random port")
    ap.add_argument("--tag", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--testbed", default="", help="a testbed prefix: rank I runs in namespace PREFIX-hI")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.port:
        import random

        args.port = random.randint(20000, 40000)
        sys.argv += ["--port", str(args.port)]
    prof = scale_profile(Profile.load(args.profile), args.scale)
    prof = replace(prof, tensors=tuple(replace(t, forward_s=t.forward_s * args.dilate,
                                               backward_s=t.backward_s * args.dilate) for t in prof.tensors))
    names = [n for n, _ in ReplayModel(prof).named_parameters()]  # the replay's names, for the wrapper's check
    prof = replace(prof, tensors=tuple(replace(t, name=n) for t, n in zip(prof.tensors, names)))
    cluster = Cluster.alpha_beta(args.alpha, 8 / 10e9 * args.scale * args.dilate, args.world)
    if args.rank >= 0:
        os.environ["MASTER_ADDR"] = "198.18.0.1"
        worker(args.rank, args.world, args, prof, cluster)
        return
    print(f"{len(prof.tensors)} tensors, {sum(t.bytes for t in prof.tensors) / 1e6:.1f} MB, {args.world} ranks, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    if not args.testbed:
        mp.spawn(worker, args=(args.world, args, prof, cluster), nprocs=args.world)
        return
    procs = [subprocess.Popen(["ip", "netns", "exec", f"{args.testbed}-h{r}", sys.executable, *sys.argv,
                               "--rank", str(r)]) for r in range(args.world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"ranks exited with {codes}")


if __name__ == "__main__":
    main()
