"""The folders where `train` and `bench` hand configs and results to their workers are private (0700).

They hold the run's configuration and results; nothing needs them readable by
other users (workers run as the same user, testbed hosts included)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gradsched import cli
from gradsched.commands import bench


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_train_workdir_is_private(monkeypatch):
    """On the testbed too (the path that once opened it to everyone)."""
    import gradsched.testbed

    seen: list[int] = []

    class FakeTestbed:
        def __init__(self, **_kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_exc):
            return False

        def launch(self, argv, **_kw):
            seen.append(_mode(Path(argv[-1]).parent))
            raise gradsched.errors.GradschedError("workers not started (test)")

    monkeypatch.setattr(gradsched.testbed, "Testbed", FakeTestbed)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cli.main(["train", "--nproc", "2", "--model", "mlp", "--steps", "1", "--rate", "100mbit"]) != 0
    assert seen and seen[0] & 0o077 == 0, oct(seen[0])


def test_bench_workdir_is_private(monkeypatch):
    seen: list[int] = []

    def fake_launch(cfg_path, hosts, shaped, timeout_s, prefix, ranks_per_host=1):
        seen.append(_mode(Path(cfg_path).parent))
        seen.append(_mode(cfg_path))

    monkeypatch.setattr(bench, "_launch", fake_launch)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # loopback, not the testbed
    assert cli.main(["bench", "--model", "mlp", "--hosts", "2"]) == 2  # no results written: a clear error
    assert seen and seen[0] & 0o077 == 0, oct(seen[0])
