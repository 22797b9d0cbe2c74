"""The entry point shared by gradsched's worker processes (``gradsched train``, ``gradsched bench``).

A worker reads its JSON config, joins the process group, runs its body, has rank 0
write the body's result as JSON into the config's ``out_dir``, and shuts down
cleanly; the module's ``__main__`` then leaves without interpreter finalisation
(:mod:`gradsched.torch.runtime.shutdown`).  A rank that fails writes its own error
(:data:`gradsched.jobs.config.ERROR_FILE`) into ``out_dir`` before it exits, so the
command shows the user that error and its rank, not the launcher's summary.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from gradsched.jobs.config import ERROR_FILE


class WorkerConfig(Protocol):
    """What :func:`run_worker` reads of a job's typed config (:class:`~gradsched.jobs.config.TrainConfig`,
    :class:`~gradsched.jobs.config.BenchConfig`)."""

    out_dir: str  # rank 0 writes the result here, a failing rank its error
    timeout_s: float  # the process group's collective timeout
    threads: int  # compute threads per rank
    backend: str | None  # None: NCCL with GPUs, else gloo


C = TypeVar("C", bound=WorkerConfig)


def run_worker(read: Callable[[dict[str, Any]], C], body: Callable[[C], Mapping[str, Any] | None], result_name: str,
               argv: list[str] | None = None) -> int:
    """Run ``body(read(config.json))`` on this rank; rank 0 writes its result to ``out_dir/result_name``.

    ``read``: the config's ``from_dict`` (the JSON the command wrote, typed where it enters the worker:
    a field it does not know fails here, in this rank's error file)."""
    argv = sys.argv[1:] if argv is None else argv
    level = os.environ.get("GRADSCHED_LOG_LEVEL")  # `gradsched --log-level`: e.g. run-time auto's decisions
    if level:
        logging.basicConfig(level=level.upper(), stream=sys.stderr,
                            format=f"gradsched[rank {os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s")
    raw = json.loads(Path(argv[0]).read_text())
    try:
        cfg = read(raw)
        torch.set_num_threads(cfg.threads)
        backend = cfg.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s))
        try:
            result = body(cfg)
            if dist.get_rank() == 0 and result is not None:
                Path(cfg.out_dir, result_name).write_text(json.dumps(result))
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        write_error(raw["out_dir"], exc)
        raise
    return 0


def write_error(out_dir: str, exc: BaseException, *, tail_lines: int = 8) -> None:
    """This rank's own error (type, message, the traceback's last lines, when) in ``out_dir``: the command
    that launched the workers shows the first rank's, instead of the launcher's summary."""
    rank = int(os.environ.get("RANK", "0"))
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    record = {"rank": rank, "time": time.time(), "type": type(exc).__name__,
              "message": str(exc), "tail": lines[-tail_lines:]}
    try:
        Path(out_dir, ERROR_FILE.format(rank=rank)).write_text(json.dumps(record))
    except OSError:
        pass  # the launcher's own report still says that this rank failed
