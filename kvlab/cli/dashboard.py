"""`kvlab dashboard [NOTEBOOK] [--port N] [--json]`: every lever of the book on one live page.

Voila serves the dashboard notebook (default ./notebooks/dashboard.ipynb: run it from the
root of a checkout, or name the notebook) on 127.0.0.1 only, with no request off the
machine (kvlab.viz.serve), until Ctrl-C or SIGTERM, which take Voila and its kernels down.

JSON contract (`--json`): once the page answers, one line {"url", "port", "notebook"} on
stdout, for a script to read; the server then runs as without it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..viz import serve
from . import add_command


def register(sub) -> None:
    p = add_command(
        sub,
        "dashboard",
        "Serve the live dashboard (Voila, 127.0.0.1 only, offline): the book's levers at any "
        "value, and a small serving run with its latency percentiles.",
    )
    p.add_argument(
        "notebook",
        nargs="?",
        default=str(serve.DASHBOARD),
        help=f"the notebook to serve (default ./{serve.DASHBOARD})",
    )
    p.add_argument(
        "--port",
        help=f"port on 127.0.0.1 (default ${serve.PORT_ENV}, else {serve.DEFAULT_PORT}; "
        "0: any free port)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print where it serves as one JSON line {url, port, notebook}, then serve",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    port = serve.port_from(args.port)
    notebook = Path(args.notebook)

    def announce(url: str) -> None:
        if args.json:
            where = {"url": url, "port": port, "notebook": str(notebook.resolve())}
            print(json.dumps(where), flush=True)
        else:
            print(f"The kvlab dashboard is served at {url} (Ctrl-C stops it)", flush=True)

    return serve.serve(notebook, port, announce)
