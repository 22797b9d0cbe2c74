"""Names and sizes that several layers share, defined once (torch-free: the command line
checks ``--model`` without importing torch)."""

from __future__ import annotations

MODEL_NAMES = ("mlp", "cnn", "vgg", "gpt2", "bert")  # gradsched.torch.jobs.models builds each
AGENT_MODULE = "gradsched.torch.jobs.agent"  # torch.distributed.run, stopped quietly: every job's launcher
REPLAY_PREFIX = "replay:"  # --model replay:PROFILE: a profile replayed (gradsched.torch.jobs.replay)
MiB = 1 << 20
