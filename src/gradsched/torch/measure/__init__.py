"""gradsched.torch.measure: measurements that feed the planner (layer profiler, FLOPs, network benchmark, contention probe)."""
