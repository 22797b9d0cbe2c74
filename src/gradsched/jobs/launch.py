"""One launcher for a job's ranks: over loopback on this machine, or on testbed hosts.

``gradsched bench``, ``train`` and ``netbench`` describe their ranks (:class:`Ranks`) and
call :func:`launch`; it owns what they used to write three times:

- **where**: ``rate`` None runs ``hosts`` nodes of ``ranks_per_host`` ranks on 127.0.0.1 (one
  ``torch.distributed.run`` per node when a node holds several ranks, so that each rank sees
  its node's ``LOCAL_WORLD_SIZE``); a rate brings up the testbed under ``prefix`` (root),
  one launcher per host, and always takes it down (:class:`gradsched.testbed.Testbed`);
- **environment**: ``threads`` compute threads per rank (``OMP_NUM_THREADS``,
  ``MKL_NUM_THREADS``), unbuffered output, gloo bound to loopback unless the user chose an
  interface (on the testbed: the host's shaped ``eth0``);
- **prefix rule**: each command's own testbed prefix (:data:`PREFIXES`), never a testbed the
  user has up (one that exists is refused, not reshaped);
- **stopping**: every launcher in its own session; on a rank's failure, the timeout, Ctrl-C,
  SIGTERM or any error, every process group gets SIGTERM, then SIGKILL after a grace
  (:class:`gradsched.testbed.Job`);
- **output**: inherited, or read line by line (``on_line``) with the last lines kept for a
  failure report (:mod:`gradsched.commands._workers`).

Torch-free: it starts ``python -m torch.distributed.run`` processes (through :data:`AGENT_MODULE`, which
stops quietly on a signal: :mod:`gradsched.torch.jobs.agent`), it imports no torch.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gradsched.constants import AGENT_MODULE
from gradsched.errors import WorkersFailed

if TYPE_CHECKING:
    from gradsched.testbed import Job

PREFIXES = {"bench": "gsb", "netbench": "gsn", "train": "gstr"}  # each command's own testbed: never `gs`
TAIL_LINES = 200  # of the ranks' combined output (with on_line), kept for a failure report
KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the rendezvous binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_command(module: str, nproc: int, cfg_path: Path | str) -> list[str]:
    """``python -m torch.distributed.run`` starting ``nproc`` ranks of ``python -m module cfg_path`` here."""
    return [sys.executable, "-m", AGENT_MODULE, f"--nproc-per-node={nproc}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", module, str(cfg_path)]


def loopback_node_commands(module: str, nodes: int, nproc_per_node: int, cfg_path: Path | str) -> list[list[str]]:
    """One ``torch.distributed.run`` per emulated node, all on 127.0.0.1: node ``i`` starts global ranks
    ``[i * M, (i + 1) * M)`` of ``python -m module cfg_path`` with torchrun's ``LOCAL_WORLD_SIZE=M``,
    ``LOCAL_RANK`` and ``GROUP_RANK=i``, as on ``nodes`` machines (the network is this one's loopback)."""
    return _node_commands(["-m", module, str(cfg_path)], nodes, nproc_per_node)


def _node_commands(script_argv: Sequence[str], nodes: int, per_node: int) -> list[list[str]]:
    port = free_port()
    return [[sys.executable, "-m", AGENT_MODULE, f"--nproc-per-node={per_node}", f"--nnodes={nodes}",
             f"--node-rank={i}", "--master-addr=127.0.0.1", f"--master-port={port}", *script_argv]
            for i in range(nodes)]


@dataclass(frozen=True, kw_only=True)
class Ranks:
    """A job's ranks: ``python [script_argv]`` (``-m module args...``) on ``hosts`` x ``ranks_per_host`` ranks."""

    script_argv: tuple[str, ...]  # what follows torchrun's options: "-m", module, its arguments
    hosts: int  # nodes on loopback, testbed hosts with a rate
    ranks_per_host: int = 1
    rate: str | int | None = None  # None: loopback; else the testbed's link rate (root)
    prefix: str = PREFIXES["bench"]  # the testbed's name prefix (with a rate)
    threads: int = 1  # compute threads per rank
    timeout_s: float | None = None  # stop the whole job after this; None: no wall-clock limit
    env: Mapping[str, str] = field(default_factory=dict)  # added to this process's environment

    @classmethod
    def of(cls, module: str, cfg_path: Path | str, **kwargs: object) -> Ranks:
        """The ranks of ``python -m module cfg_path``: how the bench and train workers start."""
        return cls(script_argv=("-m", module, str(cfg_path)), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Launched:
    """How the ranks ended: the first failing launcher's exit status (0: all succeeded; 124: timed out)."""

    code: int
    tail: list[str]  # the last lines of their output, when it was read (on_line)
    timed_out: bool = False
    timeout_s: float | None = None

    def check(self, what: str) -> None:
        """Nothing when the ranks succeeded; else :class:`WorkersFailed` naming ``what`` ("the benchmark's workers")."""
        if self.timed_out:
            raise WorkersFailed(f"{what} did not finish within {self.timeout_s:g} s; stopped them", self.code)
        if self.code != 0:
            raise WorkersFailed(f"{what} failed (exit status {self.code}); their errors are printed above", self.code)


def environment(ranks: Ranks) -> dict[str, str]:
    """The ranks' environment: this process's, with the launcher's policy over it (module docstring)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(ranks.threads), MKL_NUM_THREADS=str(ranks.threads),
               PYTHONUNBUFFERED="1", **ranks.env)
    if ranks.rate is None:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks talk over loopback, whatever the host's routes
    return env


def loopback_argvs(ranks: Ranks) -> list[list[str]]:
    """The launchers :func:`launch` starts for ``ranks`` on loopback: one, or one per node of several ranks."""
    if ranks.ranks_per_host == 1:
        return [[sys.executable, "-m", AGENT_MODULE, f"--nproc-per-node={ranks.hosts}", "--nnodes=1",
                 "--master-addr=127.0.0.1", f"--master-port={free_port()}", *ranks.script_argv]]
    return _node_commands(ranks.script_argv, ranks.hosts, ranks.ranks_per_host)


def launch(ranks: Ranks, on_line: Callable[[str], bool | None] | None = None) -> Launched:
    """Start ``ranks``, wait for all of them, stop all on a failure, the timeout or an interrupt.

    ``on_line``: each line the ranks print (stdout and stderr together) goes to it, and the last
    :data:`TAIL_LINES` it does not refuse (returns False) are kept; without it their output is this process's."""
    from gradsched.testbed import Job

    pipe: dict[str, Any] = {}
    if on_line is not None:  # one line at a time, stdout and stderr together
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "bufsize": 1}
    if ranks.rate is None:
        procs: list[subprocess.Popen] = []
        try:
            for argv in loopback_argvs(ranks):
                with signals_after_start():  # a launcher is registered before an interrupt can skip it
                    procs.append(subprocess.Popen(argv, env=environment(ranks), start_new_session=True, **pipe))
            return _wait(Job(procs), ranks.timeout_s, on_line)  # within: an interrupt before its wait stops all
        except BaseException:
            Job(procs).kill()
            raise
    return _launch_testbed(ranks, on_line, pipe)


@contextmanager
def signals_after_start() -> Iterator[None]:
    """SIGTERM and SIGINT that arrive within the block are handled as they would have been, at its end.

    Why: a handler that raises (Ctrl-C's ``KeyboardInterrupt``, :func:`gradsched._signals.sigterm_unwinds`)
    can fire inside ``subprocess.Popen`` after the child started and before ``Popen`` returns it, and the
    caller never learns of a process it must stop (a launcher and its ranks ran on, orphaned, under
    ``tests/test_bench_sigterm.py``).  Held to the block's end, the handler runs once the process is
    registered, and the caller's clean-up stops it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread
        return
    pending: list[tuple[int, Any]] = []
    saved: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in saved:
        signal.signal(s, lambda signum, frame: pending.append((signum, frame)))
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    for signum, frame in pending[:1]:  # the first: it decides (the others were the same request again)
        handler = saved[signum]
        if callable(handler):
            handler(signum, frame)  # raises, as it would have within the block
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # delivered again under the default: the process ends as it would have


def _launch_testbed(ranks: Ranks, on_line: Callable[[str], bool | None] | None, pipe: dict[str, Any]) -> Launched:
    from gradsched.testbed import Testbed, check_can_run, check_ranks_per_host

    check_can_run()
    check_ranks_per_host(ranks.ranks_per_host)
    assert ranks.rate is not None  # the testbed's links are shaped
    env = {k: v for k, v in environment(ranks).items() if k != "GLOO_SOCKET_IFNAME"}  # the host's eth0
    with Testbed(hosts=ranks.hosts, rate=ranks.rate, prefix=ranks.prefix) as tb:  # always torn down
        job = None
        try:
            with signals_after_start():
                job = tb.launch(list(ranks.script_argv), ranks_per_host=ranks.ranks_per_host, env=env, **pipe)
            return _wait(job, ranks.timeout_s, on_line)
        except BaseException:
            if job is not None:
                job.kill()
            raise


def _wait(job: Job, timeout_s: float | None, on_line: Callable[[str], bool | None] | None) -> Launched:
    from gradsched.testbed import JobTimedOut

    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    lock = threading.Lock()
    readers = [_reader(p.stdout, on_line, tail, lock) for p in job.procs
               if on_line is not None and p.stdout is not None]
    try:
        job.wait(timeout_s=timeout_s)  # stops every launcher on a failure, the timeout or an interrupt
        code, timed_out = 0, False
    except JobTimedOut as exc:
        code, timed_out = exc.exit_status, True
    except WorkersFailed as exc:
        code, timed_out = exc.exit_status, False
    finally:
        for r in readers:
            r.join(timeout=KILL_GRACE_S)
    return Launched(code, list(tail), timed_out, timeout_s)


def _reader(stream: IO[str], on_line: Callable[[str], bool | None], tail: collections.deque[str],
            lock: threading.Lock) -> threading.Thread:
    def read() -> None:
        for line in stream:
            line = line.rstrip("\n")
            with lock:
                if on_line(line) is not False:  # False: not for the failure report (a progress line)
                    tail.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread

