"""Serve the dashboard with Voila on 127.0.0.1, fully offline (`kvlab dashboard`).

Voila's `lab` template links Font Awesome from a CDN although its own bundle already
carries the same CSS; `offline_template()` derives a `kvlab` template from the installed
one without those two links, so the page makes no request off the machine.

    kvlab dashboard [NOTEBOOK] [--port N] [--json]

NOTEBOOK defaults to notebooks/dashboard.ipynb under the current folder (run from the root of
a kvlab checkout, or name it). The template and Voila's log go to ~/.cache/kvlab/voila (or
$XDG_CACHE_HOME/kvlab/voila).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import KvlabError

#: The dashboard, relative to the current folder (a checkout's root).
DASHBOARD = Path("notebooks") / "dashboard.ipynb"
TEMPLATE = "kvlab"


def cache_dir() -> Path:
    """Where the template and Voila's logs go: $XDG_CACHE_HOME/kvlab/voila, else
    ~/.cache/kvlab/voila (no checkout needed)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "kvlab" / "voila"


def offline_template(build_dir: Path | None = None) -> Path:
    """Write the `kvlab` Voila template under build_dir (default `cache_dir()`); returns the
    JUPYTER_PATH entry."""
    build_dir = build_dir or cache_dir()
    from jupyter_core.paths import jupyter_path

    labs = [Path(p) / "voila" / "templates" / "lab" for p in jupyter_path()]
    lab = next((p for p in labs if (p / "index.html.j2").is_file()), None)
    if lab is None:
        raise RuntimeError(
            "Voila's lab template was not found: is voila installed in this environment?"
        )
    target = build_dir / "voila" / "templates" / TEMPLATE
    target.mkdir(parents=True, exist_ok=True)
    source = (lab / "index.html.j2").read_text()
    kept = [line for line in source.splitlines(keepends=True) if "cdn.jsdelivr.net" not in line]
    (target / "index.html.j2").write_text("".join(kept))
    (target / "conf.json").write_text(json.dumps({"base_template": "lab"}))
    for extra in lab.iterdir():  # static files and macros the lab template ships beside it
        if extra.name != "index.html.j2" and extra.is_file():
            shutil.copyfile(extra, target / extra.name)
    return build_dir


DEFAULT_PORT = 8866
PORT_ENV = "PORT"
STOP_WAIT_S = 10.0  # Voila's grace to shut its kernels down before it is killed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_port(text: str) -> int:
    """A TCP port, 1-65535, or 0 for any free port."""
    try:
        port = int(str(text).strip())
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(
            f"expected a port from 1 to 65535 (0: any free port), got {str(text)[:40]!r}"
        )
    return port


def _check_free(port: int) -> None:
    """Fail now, in one line, when the port is taken (Voila would otherwise try others)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise KvlabError(
                f"port {port} on 127.0.0.1 is not available ({exc.strerror}); "
                f"choose another with --port or {PORT_ENV}="
            ) from None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent():
    """A `preexec_fn` that has Linux send the child SIGTERM when this process dies, however it
    dies (`kill -9` included: no handler of ours runs then), so Voila shuts its kernels down
    and frees the port instead of outliving the server. None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not after fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start(
    notebook: Path = DASHBOARD, port: int | None = None, home: str | None = None
) -> tuple[subprocess.Popen, str]:
    """Start Voila in the background, in a process group of its own; returns the process and
    its URL once it answers on exactly that port (Voila may not move to another one)."""
    if not Path(notebook).is_file():
        where = "" if Path(notebook).is_absolute() else f" under {Path.cwd()}"
        raise KvlabError(
            f"notebook {str(notebook)[:200]!r} does not exist{where}; run from the root of a "
            "kvlab checkout or name the notebook"
        )
    notebook = Path(notebook).resolve()
    port = port or free_port()
    _check_free(port)
    env = {
        **os.environ,
        "JUPYTER_PATH": os.pathsep.join(
            filter(None, [str(offline_template()), os.environ.get("JUPYTER_PATH")])
        ),
    }
    env.pop("KVLAB_BOOK_BUILD", None)  # the dashboard is always live
    if home:
        env["HOME"] = home
    voila = Path(sys.executable).with_name("voila")
    log_path = cache_dir() / f"voila-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(voila),
                str(notebook),
                "--no-browser",
                f"--port={port}",
                "--Voila.port_retries=0",
                "--Voila.ip=127.0.0.1",
                f"--template={TEMPLATE}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=str(notebook.parent),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no log)"]
            raise KvlabError(f"voila exited before serving on port {port}: {tail[0][:300]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise KvlabError("voila did not start within 60 s")


def stop(proc: subprocess.Popen, wait_s: float = STOP_WAIT_S) -> None:
    """Take Voila down with everything it started: its process group, then any kernel
    (kernels run in sessions of their own) still alive."""
    children = _descendants(proc.pid)
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    for child in children:
        try:
            child.terminate()
        except Exception:  # noqa: BLE001 - gone already (psutil.NoSuchProcess)
            continue
    _reap(children)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: Voila leads its own group
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the process is gone
        return []


def _reap(children: list) -> None:
    if not children:
        return
    import psutil

    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass


class _Stopped(Exception):
    """SIGTERM arrived."""


def _on_sigterm(signum, frame):
    raise _Stopped()


def port_from(given: str | None) -> int:
    """The port to serve on: `given` (--port), else $PORT, else DEFAULT_PORT; 0 (any free
    port) becomes a free one. A bad value raises, naming where it came from."""
    source = "--port" if given is not None else PORT_ENV
    try:
        port = parse_port(given if given is not None else os.environ.get(PORT_ENV, DEFAULT_PORT))
    except ValueError as exc:
        raise KvlabError(f"{source}: {exc}") from None
    return port or free_port()


def serve(notebook: Path, port: int, announce) -> int:
    """Serve `notebook` until Ctrl-C or SIGTERM (`kvlab dashboard`): `announce(url)` once it
    answers; everything Voila started is taken down on the way out."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    proc = None
    try:
        proc, url = start(Path(notebook), port)
        announce(url)
        code = proc.wait()
        if code:
            raise KvlabError(f"voila stopped with exit status {code}; see {cache_dir()}")
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc is not None:
            stop(proc)
    return 0
