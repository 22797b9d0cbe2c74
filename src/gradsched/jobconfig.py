"""Deprecated path: the job configurations live in :mod:`gradsched.jobs.config` (the job wing)."""

from gradsched.jobs.config import ERROR_FILE, PROGRESS_PREFIX, BenchConfig, TrainConfig  # noqa: F401

__all__ = ["ERROR_FILE", "PROGRESS_PREFIX", "BenchConfig", "TrainConfig"]
