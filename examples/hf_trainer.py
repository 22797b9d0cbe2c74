"""Train a tiny GPT-2 with the Hugging Face Trainer, gradsched's bucket advice and a gradsched hook.

Two processes on one machine (the Trainer under PyTorch's launcher, as its docs launch it):

    torchrun --nproc-per-node 2 examples/hf_trainer.py --advise --hook fp16

--advise: ``gradsched.torch.advise`` is handed the model and one batch as the Trainer
feeds it (a dict of inputs with ``labels``: the model computes its own loss, which the
advisor profiles), measures the all-reduce on these processes, and its bucket size goes
to ``TrainingArguments(ddp_bucket_cap_mb=...)``.  It issues collectives, so the process
group is started first (``PartialState``; the Trainer joins the same group).
--hook: one of gradsched's communication hooks on the Trainer's DDP
(``gradsched.integrations.hf.add_comm_hook``).  --reference: the plain Trainer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import transformers
from accelerate import PartialState

import gradsched.torch
from gradsched.integrations.hf import add_comm_hook
from gradsched.integrations.hooks import TopKState, allreduce_hook, fp16_hook, topk_hook

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
ap.add_argument("--batch-size", type=int, default=4, help="sequences per process and step")
ap.add_argument("--advise", action="store_true", help="DDP's bucket size from gradsched.torch.advise")
ap.add_argument("--hook", choices=["none", "allreduce", "fp16", "topk"], default="none",
                help="gradsched's communication hook on the Trainer's DDP (allreduce: a plain one, for checks)")
ap.add_argument("--reference", action="store_true", help="the plain Trainer: no advice, no hook")
ap.add_argument("--out", default=None, help="rank 0 saves the final parameters and step times here (torch.save)")
args = ap.parse_args()

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
cpu = not torch.cuda.is_available()
state = PartialState(cpu=cpu)  # the process group, before the advisor's collectives
say = print if state.is_main_process else (lambda *a, **k: None)

VOCAB, SEQ = 128, 32
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64,
                                                             n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
ids = torch.randint(0, VOCAB, (args.batch_size * state.num_processes * args.steps, SEQ),
                    generator=torch.Generator().manual_seed(1))
data = [{"input_ids": t, "labels": t} for t in ids]  # the Trainer's sampler gives each process its share


class StepTimes(transformers.TrainerCallback):
    """Wall-clock time of each optimizer step (from one step's begin to its end)."""

    def __init__(self) -> None:
        self.step_s: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, *a, **k):
        self._t0 = time.perf_counter()

    def on_step_end(self, *a, **k):
        self.step_s.append(time.perf_counter() - self._t0)


bucket_cap_mb = None  # the Trainer's default (PyTorch's 25 MiB)
if args.advise and not args.reference:
    collate = transformers.default_data_collator
    one_batch = collate(data[state.process_index:args.batch_size * state.num_processes:state.num_processes])
    advice = gradsched.torch.advise(model, one_batch, iterations=3, net_reps=2)  # every process calls it
    bucket_cap_mb = advice.ddp_bucket_cap_mb
    say(f"gradsched advise: ddp_bucket_cap_mb={bucket_cap_mb:g}", flush=True)
with tempfile.TemporaryDirectory() as tmp:
    targs = transformers.TrainingArguments(
        output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=1e-3,
        use_cpu=cpu, ddp_backend="gloo" if cpu else None, ddp_bucket_cap_mb=bucket_cap_mb, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0, ddp_find_unused_parameters=False)
    times = StepTimes()
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=data, callbacks=[times])
    callback = None
    if args.hook != "none" and not args.reference:
        hook_state, hook = {"allreduce": (None, allreduce_hook), "fp16": (None, fp16_hook),
                            "topk": (TopKState(density=0.05), topk_hook)}[args.hook]
        callback = add_comm_hook(trainer, hook, hook_state)
    result = trainer.train()
say(f"{state.num_processes} processes, trained {result.global_step} steps, loss {result.training_loss:.4f}"
    + (f", hook {args.hook} on {type(callback.registered_on).__name__}" if callback else ""), flush=True)
if args.out and state.is_main_process:
    torch.save({"params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
                "step_s": times.step_s}, args.out)
state.wait_for_everyone()
