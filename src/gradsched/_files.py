"""The user's files, read and written safely: every path a command is handed goes through here.

Why: a path on the command line can name anything.  A named pipe blocks a reader
for ever, ``/dev/zero`` never ends (it filled 24 GB before a MemoryError), a file of
a billion bytes would be parsed whole, a UTF-16 export or a stray byte is a
``UnicodeDecodeError``, a 5,000-digit integer or JSON nested 100,000 deep a
``ValueError`` or ``RecursionError`` from :mod:`json`, and a full disk an ``OSError``
without a file name (issue 39).  Here each becomes one :class:`FormatError` or
:class:`GradschedError` that names the file, the cause and what to do, before any
byte is parsed:

- inputs are regular files only (opened without blocking, then checked with
  ``fstat``), at most :data:`MAX_INPUT_BYTES` (checked on the size, then on what is
  read, in case the file grows);
- text is UTF-8 (a UTF-8 byte-order mark is allowed); another encoding is named;
- JSON holds no integer of more than :data:`MAX_INT_DIGITS` digits and nests at most
  :data:`MAX_JSON_DEPTH` deep (gradsched's formats nest 6 at most);
- a write that fails (no space, no permission, no such folder) names the path.

Outputs are not required to be regular files: ``--json >(jq .)`` writes to a pipe.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from pathlib import Path
from typing import Any

from gradsched.errors import FormatError, GradschedError

MAX_INPUT_BYTES = 64 * 2**20  # a profile of 10,000 tensors is about 2 MiB; a plan or cluster less
MAX_TRACE_BYTES = 1024 * 2**20  # Chrome traces of long runs are larger: about 150 bytes per event
MAX_INT_DIGITS = 30  # every integer field is at most 2**62 (19 digits)
MAX_JSON_DEPTH = 64  # the formats nest 6 deep; tools' own extra fields get room to spare

_READ_CHUNK = 1 << 20


class _IntegerTooLong(Exception):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def read_bytes(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; anything else is a FormatError."""
    source = str(path)
    try:  # O_NONBLOCK: opening a named pipe must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FormatError(source, "<file>", f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FormatError(source, "<file>", f"is {_kind(mode)}, not a regular file; gradsched reads files only "
                                                "(save the data to a file and give its path)")
        _check_size(source, os.fstat(fd).st_size, max_bytes)
        chunks, total = [], 0
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
            total += len(chunk)
            _check_size(source, total, max_bytes)  # the file grew while it was read
        return b"".join(chunks)
    except OSError as exc:
        raise FormatError(source, "<file>", f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _check_size(source: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise FormatError(source, "<file>", f"is {size / 2**20:,.1f} MiB, above the most gradsched reads "
                                            f"({max_bytes / 2**20:,.0f} MiB); give the file gradsched wrote")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def decode_text(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); another encoding is named, not guessed."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    encoding = json.detect_encoding(data)
    if encoding != "utf-8":
        raise FormatError(source, "<file>", f"is {encoding.upper()} text; gradsched reads UTF-8: convert it, "
                                            f"e.g. iconv -f {encoding} -t utf-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FormatError(source, "<file>", f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                                            f"(line {line}); save it as UTF-8") from None


def parse_json(text: str, source: str) -> Any:
    """``text`` parsed as JSON, within :data:`MAX_INT_DIGITS` and :data:`MAX_JSON_DEPTH`."""
    try:
        data = json.loads(text, parse_int=_int)
    except _IntegerTooLong as exc:
        raise FormatError(source, "<json>", f"holds an integer of {exc.digits:,} digits; no field takes more than "
                                            f"{MAX_INT_DIGITS}") from None
    except RecursionError:
        raise FormatError(source, "<json>", f"nests deeper than {MAX_JSON_DEPTH} levels; no gradsched file "
                                            "does") from None
    except json.JSONDecodeError as exc:
        raise FormatError(source, "<json>", f"malformed JSON at line {exc.lineno} column {exc.colno}: "
                                            f"{exc.msg}") from None
    if _depth_above(data, MAX_JSON_DEPTH):
        raise FormatError(source, "<json>", f"nests deeper than {MAX_JSON_DEPTH} levels; no gradsched file does")
    return data


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _IntegerTooLong(digits)
    return int(text)


def _depth_above(data: Any, limit: int) -> bool:
    """Whether ``data`` nests lists and objects more than ``limit`` deep (without recursing)."""
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def read_json(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """The JSON in the regular file ``path``: read, decoded and parsed within the limits above."""
    source = str(path)
    return parse_json(decode_text(read_bytes(path, max_bytes=max_bytes), source), source)


def write_text(path: str | Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` (its folder made if missing); a failure is one line naming the path."""
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a folder should be says "File exists": name the folder
        raise output_error(path, exc, f"its folder {folder} cannot be made") from None
    try:
        with open(path, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
    except OSError as exc:
        raise output_error(path, exc) from None


def output_error(path: str | Path, exc: OSError, what: str = "") -> GradschedError:
    """The one-line error for an output ``path`` that could not be written (``exc``: why; ``what``: where)."""
    where = f" ({what}: {exc.strerror or exc})" if what else f": {exc.strerror or exc}"
    return GradschedError(f"{path}: cannot be written{where}; give a path in a folder you can write, on a disk "
                          "with free space")
