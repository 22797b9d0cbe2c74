"""SIGTERM to a running ``gradsched bench`` leaves nothing behind (issue 39 item 5).

Python's default SIGTERM ends the process at once, skipping every ``with`` exit: the
bench's temporary ``gradsched-bench-*`` folder stayed in /tmp.  The bench is started
over loopback (no root), terminated once its folder exists, and must remove the folder,
stop its workers and still end "terminated by SIGTERM"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")


def _wait_for(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            ps = subprocess.run(["ps", "-ww", "-eo", "pid,etime,args"], capture_output=True, text=True).stdout
            raise TimeoutError(f"condition not reached; processes: {[ln for ln in ps.splitlines() if 'gradsched' in ln]}")
        time.sleep(0.02)


def _bench_folders(tmp) -> list[str]:
    return [n for n in os.listdir(tmp) if n.startswith("gradsched-bench-")]


def _workers_of(folder_parent) -> list[str]:
    """Processes whose command line names a config under ``folder_parent`` (the bench's workers)."""
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if str(folder_parent) in ln and "bench_worker" in ln]


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before the workers start", "while the workers run"])
def test_sigterm_leaves_no_temporary_folder(tmp_path, when):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    err = open(tmp_path / "stderr", "w+")  # noqa: SIM115 - read after the process ends
    proc = subprocess.Popen([sys.executable, "-m", "gradsched.cli", "bench", "--loopback", "--model", "mlp",
                             "--strategies", "ddp", "--ddp-buckets", "none", "--no-probe", "--rounds", "200",
                             "--steps", "5", "-q"], env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_for(lambda: _bench_folders(tmp_path) != [] or proc.poll() is not None)
        if when == "while the workers run":
            _wait_for(lambda: _workers_of(tmp_path) != [] or proc.poll() is not None)
        assert proc.poll() is None, "the bench ended before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # still reported as terminated by the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _bench_folders(tmp_path) == []
    _wait_for(lambda: _workers_of(tmp_path) == [], timeout_s=10)  # and its workers were stopped
    err.seek(0)
    said = err.read()
    # one line: no launcher's SignalException traceback (torch's elastic agent printed one per host)
    assert "Traceback" not in said and "SignalException" not in said and "death signal" not in said, said
    assert said.strip().splitlines()[-1] == "gradsched bench: terminated (SIGTERM); its workers were stopped"


def _train_folders(tmp) -> list[str]:
    return [n for n in os.listdir(tmp) if n.startswith("gradsched-train-")]


@pytest.mark.slow
def test_train_sigterm_leaves_no_temporary_folder_and_stops_its_workers(tmp_path):
    """The same for ``gradsched train`` (it left ``gradsched-train-*`` behind): one launcher, one policy."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "gradsched.cli", "train", "--model", "mlp", "--steps", "1000000",
                             "-q"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = lambda: [ln for ln in subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True,  # noqa: E731
                                                    text=True).stdout.splitlines()
                       if str(tmp_path) in ln and "gradsched.torch.jobs.trainer" in ln]
    try:
        _wait_for(lambda: workers() != [] or proc.poll() is not None)
        assert proc.poll() is None, "the training ended before it could be terminated"
        assert _train_folders(tmp_path) != []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _train_folders(tmp_path) == []
    _wait_for(lambda: workers() == [], timeout_s=10)
