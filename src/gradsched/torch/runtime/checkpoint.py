"""Checkpoint files with a checksum: ``save_checkpoint(state, path)`` and ``load_checkpoint(path)``.

``torch.save``'s zip container does not check what it reads back: a checkpoint with 64
bytes overwritten inside a tensor loaded without error, and a resumed run went on from
damaged weights (issue 39).  A gradsched checkpoint is one header line, then
``torch.save``'s bytes:

    GRADSCHED-CHECKPOINT 1 sha256=<64 hex digits> bytes=<payload size>\\n<torch.save payload>

:func:`load_checkpoint` verifies size and SHA-256 before unpickling anything (with
``weights_only=True``: tensors, numbers, strings and containers of them), and refuses a
file that fails with a :class:`CheckpointError` naming the file and what to do.
:func:`save_checkpoint` writes a temporary file beside ``path``, flushes it to disk and
renames it over ``path``: a crash mid-save leaves the previous checkpoint whole.  The
payload is built in memory (twice the state's size while saving or loading).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from gradsched.errors import GradschedError

MAGIC = b"GRADSCHED-CHECKPOINT"
VERSION = 1
MAX_HEADER_BYTES = 256


class CheckpointError(GradschedError):
    """A checkpoint file that is not one, or whose content does not match its checksum."""


def save_checkpoint(state: Any, path: str | os.PathLike[str]) -> None:
    """Write ``state`` (what ``torch.save`` takes) to ``path`` with its checksum, atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    header = f"{MAGIC.decode()} {VERSION} sha256={hashlib.sha256(payload).hexdigest()} bytes={len(payload)}\n"
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header.encode())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {target}: {exc.strerror or exc}; check the directory "
                              "exists, is writable and has space") from exc


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = None) -> Any:
    """The state :func:`save_checkpoint` wrote to ``path``, after checking its size and checksum."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
    payload = _verified_payload(data, str(path))
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)


def _verified_payload(data: bytes, source: str) -> memoryview:
    end = data.find(b"\n", 0, MAX_HEADER_BYTES)
    fields = data[:end].split(b" ") if end > 0 else []
    if (len(fields) != 4 or fields[0] != MAGIC or not fields[2].startswith(b"sha256=")
            or not fields[3].startswith(b"bytes=")):
        raise CheckpointError(f"{source} is not a gradsched checkpoint (no '{MAGIC.decode()}' header): write it "
                              "with gradsched.torch.save_checkpoint (a plain torch.save file loads with torch.load)")
    if fields[1] != str(VERSION).encode():
        raise CheckpointError(f"{source}: checkpoint format version {fields[1].decode(errors='replace')}, this "
                              f"gradsched reads version {VERSION}; load it with the gradsched that wrote it")
    payload = memoryview(data)[end + 1:]
    want_size, want_sum = fields[3][len(b"bytes="):].decode(errors="replace"), fields[2][len(b"sha256="):].decode(
        errors="replace")
    if str(len(payload)) != want_size:
        raise CheckpointError(f"{source} is truncated or extended: {len(payload)} bytes of content where {want_size} "
                              "were written (an interrupted copy?); resume from an earlier checkpoint or copy it again")
    if hashlib.sha256(payload).hexdigest() != want_sum:
        raise CheckpointError(f"{source} is corrupted: its content does not match the SHA-256 written with it "
                              "(damaged on disk or in a copy); resume from an earlier checkpoint or copy it again")
    return payload
