"""Deprecated path: the launcher lives in :mod:`gradsched.jobs.launch` (torch-free, the job wing)."""

from gradsched.jobs.launch import free_port, loopback_command, loopback_node_commands  # noqa: F401

__all__ = ["free_port", "loopback_command", "loopback_node_commands"]
