"""Parsed traces kept on disk, so that a trace is parsed and validated once, not per process.

Every `kvlab prefix-cache conversation` and every notebook kernel of a book build used to
parse and validate the same 3 MB of JSON again (~80 ms of the command's ~300 ms). After a
trace file is read successfully, its validated requests are written with `marshal` (the
fastest loader in the standard library; ~20 ms back) to
`$XDG_CACHE_HOME/kvlab/parsed/<hash of the path>.marshal`, stamped with the file's
identity (device, inode, size, modification time in ns), the format version and the block
size, and a CRC of the payload. A stamp that does not match, a damaged file or any error
simply means "parse the trace again"; a failed write is ignored (a read-only home works).
`KVLAB_TRACE_CACHE=0` turns this off. Only regular files are kept, never a pipe, and a
trace that fails validation is never kept.
"""

from __future__ import annotations

import hashlib
import itertools
import marshal
import os
import tempfile
import zlib
from pathlib import Path

from .types import Request

#: Bump when the validation rules or the Request fields change: old files are then ignored.
FORMAT = 1
ENV = "KVLAB_TRACE_CACHE"


def _file(path: Path) -> Path | None:
    if os.environ.get(ENV) == "0":
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    ident = str(path.resolve()).encode("utf-8", "surrogateescape")
    return base / "kvlab" / "parsed" / f"{hashlib.sha256(ident).hexdigest()[:32]}.marshal"


def _stamp(st: os.stat_result, block_tokens: int) -> tuple:
    return (FORMAT, block_tokens, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def load(path: Path, st: os.stat_result, block_tokens: int):
    """The requests parsed from this very version of `path` before, or None."""

    try:
        file = _file(path)
        if file is None:
            return None
        blob = file.read_bytes()
        if zlib.crc32(blob[4:]).to_bytes(4, "little") != blob[:4]:
            return None
        stamp, rows = marshal.loads(blob[4:])
        if stamp != _stamp(st, block_tokens):
            return None
        return tuple(itertools.starmap(Request, rows))
    except Exception:  # noqa: BLE001 - missing, stale or damaged: the caller parses the trace
        return None


def store(path: Path, st: os.stat_result, block_tokens: int, requests) -> None:
    """Keep the validated requests of `path` (atomically; any failure is ignored)."""

    file = _file(path)
    if file is None:
        return
    rows = tuple((r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids) for r in requests)
    payload = marshal.dumps((_stamp(st, block_tokens), rows))
    tmp = None
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".partial")
        with os.fdopen(fd, "wb") as out:
            out.write(zlib.crc32(payload).to_bytes(4, "little") + payload)
        os.replace(tmp, file)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
