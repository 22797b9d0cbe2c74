"""gradsched.integrations: gradsched inside the frameworks that build their own DDP.

- :mod:`gradsched.integrations.lightning`: ``GradschedStrategy``, any plan as a PyTorch
  Lightning strategy (``pip install 'gradsched[lightning]'``);
- :mod:`gradsched.integrations.hooks`: communication hooks for PyTorch's own DDP
  (``register_comm_hook``; Accelerate, the HF Trainer, Lightning's ``"ddp"``);
- :mod:`gradsched.integrations.hf`: ``add_comm_hook``, a hook on the DDP the Hugging Face
  Trainer builds (``pip install 'gradsched[transformers]'``).

Each imports its framework only when imported itself: this package imports nothing.
They sit on the runtime (``gradsched.torch``), below the jobs and the command line.
The old paths ``gradsched.lightning``, ``gradsched.hf``, ``gradsched.torch.hooks`` and
``gradsched.torch.runtime.hooks`` re-export the same objects (docs/integrations.md).
"""
