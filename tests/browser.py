"""Shared browser-test plumbing: build or reuse the site, serve it on 127.0.0.1, drive
Debian's Chromium with Playwright (no browser download)."""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("Chromium is not installed: run `make system-deps` (apt-get install -y chromium)")
    return path


def ensure_site() -> Path:
    """Reuse _build/html when `make book` built it, else build it (warnings as errors)."""
    if not (SITE / "index.html").exists():
        env = {**os.environ, "KVLAB_BOOK_BUILD": "1"}
        jb = Path(sys.executable).with_name("jupyter-book")
        subprocess.run([str(jb), "build", str(ROOT), "--warningiserror", "--nitpick", "--keep-going"],
                       check=True, env=env, cwd=ROOT)
    return SITE


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(folder: Path):
    """Serve a folder on 127.0.0.1 on a free port; yields the base URL."""
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def site_pages() -> list[str]:
    """Every HTML page of the built book (relative paths)."""
    if not SITE.exists():
        return []
    pages = []
    for path in sorted(SITE.rglob("*.html")):
        rel = path.relative_to(SITE).as_posix()
        if rel.startswith(("_static/", "_sources/", "_images/")):
            continue
        pages.append(rel)
    return pages


def page_panels() -> list[tuple[str, str]]:
    """(page, panel key) for every static panel the built book embeds."""
    import re

    found = []
    for page in site_pages():
        text = (SITE / page).read_text(encoding="utf-8")
        for key in re.findall(r'class="kvlab-panel" data-panel="([\w-]+)"', text):
            found.append((page, key))
    return found
