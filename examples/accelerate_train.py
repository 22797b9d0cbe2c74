"""Train a tiny GPT-2 with HF Accelerate, gradsched's bucket advice and a gradsched communication hook.

Two processes on one machine, CPUs or GPUs (Accelerate's torchrun-based launcher):

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --advise --hook fp16

or, the same, with PyTorch's launcher:

    torchrun --nproc-per-node 2 examples/accelerate_train.py --advise --hook fp16

On CPUs Accelerate starts its distributed mode only when told to use the CPU
(``Accelerator(cpu=True)``, or ``ACCELERATE_USE_CPU=1``); this script says so when no GPU
is there.  ``accelerate launch --cpu --num_processes 2`` is not a way to get two CPU
processes: with ``--cpu`` accelerate 1.16 runs its simple launcher, one process (several
only through MPI, ``--mpirun_hostfile``).  ``--multi_gpu`` names the launcher, which
starts the processes with torchrun; the devices are chosen here.

--advise: ``gradsched.torch.advise`` profiles the model on one batch and measures the
all-reduce on these processes, and its bucket size goes to DDP
(``DistributedDataParallelKwargs(bucket_cap_mb=...)``).  The process group must exist
before (the advisor issues collectives) and the bucket size must reach the Accelerator
when it is built, so ``PartialState`` starts the processes' group first.
--hook: one of gradsched's communication hooks, registered on the DDP Accelerate built.
--reference: plain Accelerate (no advice, no hook), for comparison.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import transformers
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedDataParallelKwargs

import gradsched.torch
from gradsched.integrations.hooks import TopKState, allreduce_hook, fp16_hook, register_hook, topk_hook

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
ap.add_argument("--batch-size", type=int, default=4, help="sequences per process and step")
ap.add_argument("--advise", action="store_true", help="DDP's bucket size from gradsched.torch.advise")
ap.add_argument("--hook", choices=["none", "allreduce", "fp16", "topk"], default="none",
                help="gradsched's communication hook on Accelerate's DDP (allreduce: a plain one, for checks)")
ap.add_argument("--reference", action="store_true", help="plain Accelerate: no advice, no hook")
ap.add_argument("--out", default=None, help="rank 0 saves the final parameters and step times here (torch.save)")
args = ap.parse_args()

# ----------------------------------------------------------------------------- processes
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
cpu = not torch.cuda.is_available()  # Accelerate's multi-process CPU mode needs to be asked for
state = PartialState(cpu=cpu)  # joins the process group now: the advisor below issues collectives
say = print if state.is_main_process else (lambda *a, **k: None)
say(f"{state.num_processes} processes, {state.distributed_type}, device {state.device}", flush=True)

# ----------------------------------------------------------------------------- model and data
VOCAB, SEQ = 128, 32
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64,
                                                             n_layer=2, n_head=2, bos_token_id=0,
                                                             eos_token_id=0))  # random weights: no download


def batch(step: int) -> dict[str, torch.Tensor]:
    """This process's share of step ``step``'s global batch, as a dict the model takes (labels: its own loss)."""
    ids = torch.randint(0, VOCAB, (args.batch_size * state.num_processes, SEQ),
                        generator=torch.Generator().manual_seed(step))
    mine = ids[state.process_index::state.num_processes]
    return {"input_ids": mine, "labels": mine}


# ----------------------------------------------------------------------------- advice, Accelerator, hook
bucket_cap_mb = 25.0  # PyTorch's default
if args.advise and not args.reference:
    advice = gradsched.torch.advise(model, batch(0), iterations=3, net_reps=2)  # every process calls it
    bucket_cap_mb = advice.ddp_bucket_cap_mb
    say(f"gradsched advise: bucket_cap_mb={bucket_cap_mb:g} (predicted {advice.ddp_predicted_s * 1e3:.1f} ms "
        f"against {advice.ddp_default_s * 1e3:.1f} ms at DDP's default)", flush=True)
accelerator = Accelerator(cpu=cpu, kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=bucket_cap_mb)])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)
if args.hook != "none" and not args.reference:
    hook_state, hook = {"allreduce": (None, allreduce_hook), "fp16": (None, fp16_hook),
                        "topk": (TopKState(density=0.05), topk_hook)}[args.hook]
    ddp = register_hook(model, hook_state, hook)  # None with one process: nothing to communicate
    say(f"gradsched hook {args.hook} registered on {type(ddp).__name__}", flush=True)

# ----------------------------------------------------------------------------- training
torch.manual_seed(1 + state.process_index)  # dropout's draws: the same with and without the advisor's iterations
step_s = []
for step in range(args.steps):
    t0 = time.perf_counter()
    loss = model(**batch(step)).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    step_s.append(time.perf_counter() - t0)
    if step in (0, args.steps - 1):
        say(f"step {step + 1}/{args.steps}  loss {loss.item():.4f}", flush=True)
if args.out and state.is_main_process:
    params = {n: p.detach().cpu().clone() for n, p in accelerator.unwrap_model(model).named_parameters()}
    torch.save({"params": params, "step_s": step_s}, args.out)
accelerator.wait_for_everyone()
accelerator.end_training()
