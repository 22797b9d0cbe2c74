"""gradsched.torch: the PyTorch runtime (imports torch; the planning core does not)."""
