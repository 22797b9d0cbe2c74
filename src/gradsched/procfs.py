"""One figure of a ``/proc`` file: the machine's available memory, a process's peak RSS."""

from __future__ import annotations


def proc_bytes(path: str, key: str) -> int | None:
    """The ``key:`` line of ``path`` (``/proc/meminfo``, ``/proc/self/status``; in kB) in bytes, or None
    where the file or the line cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
