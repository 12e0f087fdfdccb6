"""A chapter's expensive simulations, computed once per book build and shared by its two
editions: a pickle under _build/kvlab-runs/, keyed by the run's name, its inputs and a
digest of kvlab's code and data but the figures, labs and command line (any change to the
simulator, the ledger, the catalogues, the traces' loader or the chapters' runs recomputes
it). Nothing is precomputed by hand: the first
edition's build runs the simulation, the second reads what the first wrote.

`KVLAB_RUN_CACHE` names another folder; `KVLAB_RUN_CACHE=off` turns the cache off."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
#: Folders of the package whose code cannot change a simulation's result.
PRESENTATION = ("viz", "labs", "cli", "__pycache__")


@functools.cache
def code_digest() -> str:
    """sha256 over kvlab's files but the figures, labs and command line."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*")):
        rel = path.relative_to(PACKAGE)
        if not path.is_file() or rel.parts[0] in PRESENTATION or path.suffix == ".pyc":
            continue
        h.update(str(rel).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _folder() -> Path | None:
    where = os.environ.get("KVLAB_RUN_CACHE", "")
    if where.lower() == "off":
        return None
    return Path(where) if where else PACKAGE.parent / "_build" / "kvlab-runs"


def cached(name: str, inputs, compute):
    """compute() once for (name, repr(inputs), code digest); later calls, in this process or
    a later one (the other edition's build), read the stored result. A folder that cannot
    be written only costs the recomputation."""
    folder = _folder()
    if folder is None:
        return compute()
    key = hashlib.sha256(f"{name}\n{inputs!r}\n{code_digest()}".encode()).hexdigest()[:24]
    path = folder / f"{name}-{key}.pickle"
    try:
        with path.open("rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    value = compute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    except OSError:
        pass
    return value
