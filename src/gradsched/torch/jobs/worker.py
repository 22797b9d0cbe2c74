"""The entry point shared by gradsched's worker processes (``gradsched train``, ``gradsched bench``).

A worker reads its JSON config, joins the process group, runs its body, has rank 0
write the body's result as JSON into the config's ``out_dir``, and shuts down
cleanly; the module's ``__main__`` then leaves without interpreter finalisation
(:mod:`gradsched.torch.runtime.shutdown`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist


def run_worker(body: Callable[[dict[str, Any]], dict[str, Any] | None], result_name: str,
               argv: list[str] | None = None) -> int:
    """Run ``body(cfg)`` on this rank; rank 0 writes its result to ``out_dir/result_name``.

    Config keys used here: ``out_dir``, ``timeout_s``, ``threads`` (default 1: the
    machine's cores are shared by the ranks), ``backend`` (default NCCL with GPUs,
    else gloo)."""
    argv = sys.argv[1:] if argv is None else argv
    level = os.environ.get("GRADSCHED_LOG_LEVEL")  # `gradsched --log-level`: e.g. run-time auto's decisions
    if level:
        logging.basicConfig(level=level.upper(), stream=sys.stderr,
                            format=f"gradsched[rank {os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s")
    cfg = json.loads(Path(argv[0]).read_text())
    torch.set_num_threads(cfg.get("threads", 1))
    backend = cfg.get("backend") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg["timeout_s"]))
    try:
        result = body(cfg)
        if dist.get_rank() == 0 and result is not None:
            Path(cfg["out_dir"], result_name).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0
