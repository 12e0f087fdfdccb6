"""Serve the dashboard with Voila on 127.0.0.1, fully offline.

Voila's `lab` template links Font Awesome from a CDN although its own bundle already
carries the same CSS; `offline_template()` derives a `kvlab` template from the installed
one without those two links, so the page makes no request off the machine.

    python -m kvlab.viz.serve [--port N] [NOTEBOOK]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "notebooks" / "dashboard.ipynb"
TEMPLATE = "kvlab"


def offline_template(build_dir: Path = ROOT / "_build" / "voila") -> Path:
    """Write the `kvlab` Voila template under build_dir; returns the JUPYTER_PATH entry."""
    from jupyter_core.paths import jupyter_path

    labs = [Path(p) / "voila" / "templates" / "lab" for p in jupyter_path()]
    lab = next((p for p in labs if (p / "index.html.j2").is_file()), None)
    if lab is None:
        raise RuntimeError("Voila's lab template was not found: is voila installed in this environment?")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(notebook: Path = DASHBOARD, port: int | None = None, home: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start Voila in the background; returns the process and its URL once it answers."""
    port = port or free_port()
    env = {**os.environ, "JUPYTER_PATH": os.pathsep.join(filter(None, [str(offline_template()),
                                                                         os.environ.get("JUPYTER_PATH")]))}
    env.pop("KVLAB_BOOK_BUILD", None)  # the dashboard is always live
    if home:
        env["HOME"] = home
    voila = Path(sys.executable).with_name("voila")
    log_path = ROOT / "_build" / "voila" / f"voila-{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(voila), str(notebook), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1", f"--template={TEMPLATE}"],
        env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=str(notebook.parent),
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"voila exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("voila did not start within 60 s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab.viz.serve", description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", default=str(DASHBOARD))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8866)))
    args = parser.parse_args(argv)
    proc, url = start(Path(args.notebook).resolve(), args.port)
    print(f"The kvlab dashboard is served at {url} (Ctrl-C stops it)", flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
