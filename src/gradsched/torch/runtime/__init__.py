"""gradsched.torch.runtime: what runs inside a training step (wrapper, executor, collectives, optimizer, traces)."""
