"""The launcher every job starts per host stops quietly on a signal (gradsched.torch.jobs.agent)."""

from __future__ import annotations

import logging
import signal

import pytest

pytest.importorskip("torch")


def test_a_signalled_agent_exits_with_its_status_and_no_traceback(monkeypatch, capsys, caplog):
    """torch's elastic agent stops its workers and raises SignalException: each launcher printed its traceback
    and a warning per worker closed (on 2 hosts, two tracebacks under the command's one line)."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gradsched.torch.jobs import agent

    def stopped(argv=None):
        logging.getLogger("torch.distributed.elastic.agent.server.api").warning(
            "Received %s death signal, shutting down workers", signal.SIGTERM)
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").warning(
            "Sending process %s closing signal %s", 1234, "SIGTERM")
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").warning("a worker failed")
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(run, "main", stopped)
    with caplog.at_level(logging.WARNING):
        assert agent.main([]) == 128 + signal.SIGTERM
    assert [r.getMessage() for r in caplog.records] == ["a worker failed"]  # anything else passes through
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out


def test_an_agent_returns_torchruns_own_exit_status(monkeypatch):
    from torch.distributed import run

    from gradsched.torch.jobs import agent

    def failed(argv=None):
        raise SystemExit(2)  # torchrun refused its arguments

    monkeypatch.setattr(run, "main", failed)
    assert agent.main([]) == 2
    monkeypatch.setattr(run, "main", lambda argv=None: None)
    assert agent.main([]) == 0
