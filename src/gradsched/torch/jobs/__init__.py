"""gradsched.torch.jobs: whole processes (trainer, bench worker, self-test) built from the runtime and the measurements."""
