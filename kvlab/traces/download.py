"""Fetch the public Mooncake FAST'25 traces into the trace cache, checked and written atomically.

The files come from kvcache-ai/Mooncake, folder FAST25-release/traces/, pinned to one commit
and checked against known sha256 digests. A file is streamed into a temporary file beside
its destination and renamed into place only when its digest matches, so an interrupted or
corrupted download never leaves a half-written trace behind. `base_url` (or
$KVLAB_TRACE_BASE_URL) points at a mirror, or at a local server in tests.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvlabError, unknown_name
from . import KNOWN_TRACES, cache_dir

MOONCAKE_COMMIT = "3b5a5941"
DEFAULT_BASE_URL = f"https://raw.githubusercontent.com/kvcache-ai/Mooncake/{MOONCAKE_COMMIT}/FAST25-release/traces/"
BASE_URL_ENV = "KVLAB_TRACE_BASE_URL"
SHA256 = {
    "conversation_trace.jsonl": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "synthetic_trace.jsonl": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
}
CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Downloaded:
    name: str
    path: str
    bytes: int
    sha256: str
    fetched: bool  # False when a verified copy was already there


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Progress:
    """One self-rewriting line on a terminal; a line per quarter otherwise."""

    def __init__(self, label: str, total: int | None, stream):
        self.label, self.total, self.stream = label, total, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last_time = 0.0
        self.shown = -1  # bytes in the last line written
        self.next_share = 0.25

    def update(self, done: int, final: bool = False) -> None:
        if not self.stream or done == self.shown:
            return
        share = done / self.total if self.total else None
        if self.tty:
            now = time.monotonic()
            if not final and now - self.last_time < 0.1:
                return
            self.last_time = now
        elif not final:
            if share is None or share < self.next_share:
                return
            self.next_share = (int(share * 4) + 1) / 4
        self.shown = done
        size = f"{done / 1e6:.1f}" + (
            f"/{self.total / 1e6:.1f} MB ({100 * share:3.0f}%)" if share is not None else " MB"
        )
        start, end = ("\r" if self.tty else ""), ("\n" if final or not self.tty else "")
        self.stream.write(f"{start}downloading {self.label}: {size}{end}")
        self.stream.flush()

    def close(self, done: int) -> None:
        if self.tty and self.stream and done == self.shown:
            self.stream.write("\n")  # end the rewritten line
        else:
            self.update(done, final=True)


def download_trace(
    name: str,
    dest_dir: str | Path | None = None,
    base_url: str | None = None,
    force: bool = False,
    timeout_s: float = 60.0,
    progress=None,
) -> Downloaded:
    """Download one known trace (`conversation`, `synthetic`) into `dest_dir` (default: the cache).

    Raises KvlabError on a bad URL, a network error or a checksum mismatch; nothing is left
    behind then, not even a folder it created. Progress goes to `progress` (default
    sys.stderr; False for none).
    """
    progress = sys.stderr if progress is None else progress
    if name not in KNOWN_TRACES:
        raise unknown_name("trace", name, KNOWN_TRACES)
    filename = KNOWN_TRACES[name]
    expected = SHA256[filename]
    folder = Path(dest_dir).expanduser() if dest_dir is not None else cache_dir()
    target = folder / filename
    if not force and _is_file(target) and sha256_file(target) == expected:
        return Downloaded(name, str(target), target.stat().st_size, expected, fetched=False)
    url = _base_url(base_url).rstrip("/") + "/" + filename
    created = _make_folder(folder)
    try:
        done = _fetch(url, folder, target, expected, timeout_s, progress)
    except BaseException:
        _remove_empty(created)
        raise
    return Downloaded(name, str(target), done, expected, fetched=True)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError as exc:  # a folder name longer than the file system allows
        raise KvlabError(
            f"cannot use trace folder {_clip(str(path.parent))}: {exc.strerror or exc}"
        ) from None


def _base_url(base_url: str | None) -> str:
    """The mirror to fetch from, checked before anything is created: http(s) or file URLs.
    An empty --base-url is an error (not the default), an empty variable counts as unset."""
    if base_url is not None:
        base, source = base_url, "--base-url"
    else:
        base, source = os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL, BASE_URL_ENV
    parts = urllib.parse.urlsplit(base)
    no_host = parts.scheme != "file" and not parts.netloc
    if parts.scheme not in ("http", "https", "file") or no_host:
        raise KvlabError(
            f"the trace base URL must be an http://, https:// or file:// URL, "
            f"got {_clip(base)!r} (from {source})"
        )
    return base


def _make_folder(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns those created, outermost first."""
    try:
        created = [p for p in reversed([folder, *folder.parents]) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvlabError(
            f"cannot create trace folder {_clip(str(folder))!r}: {exc.strerror or exc}"
        ) from None
    return created


def _remove_empty(created: list[Path]) -> None:
    """Undo `_make_folder`: remove the folders it created, innermost first, while empty."""
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return


def _fetch(url: str, folder: Path, target: Path, expected: str, timeout_s: float, progress) -> int:
    """Stream `url` into a temporary file beside `target`; rename it into place once its
    sha256 matches. Returns the bytes written."""
    filename = target.name
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{filename}.", suffix=".partial")
    digest, done = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            with _open_url(url, timeout_s) as response:
                length = response.headers.get("Content-Length")
                bar = _Progress(
                    filename, int(length) if length and length.isdigit() else None, progress
                )
                try:
                    while chunk := response.read(CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        bar.update(done)
                except (OSError, urllib.error.URLError) as exc:
                    raise KvlabError(
                        f"download of {url} broke off after {done:,} bytes: {exc}"
                    ) from None
                bar.close(done)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != expected:
            raise KvlabError(
                f"checksum mismatch for {filename} from {url}: expected sha256 {expected}, got "
                f"{got} ({done:,} bytes); nothing was written"
            )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; a trace is ordinary data
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return done


def _open_url(url: str, timeout_s: float):
    try:
        return urllib.request.urlopen(url, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        raise KvlabError(f"cannot download {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KvlabError(
            f"cannot download {url}: {reason}; check the network, or pass --base-url "
            f"(or set {BASE_URL_ENV}) to a mirror"
        ) from None


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
