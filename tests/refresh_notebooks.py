"""Re-execute chapter notebooks and store only the outputs nbval checks.

Cells marked `# NBVAL_CHECK_OUTPUT` keep their freshly computed output (the reference
numbers the lab tests compare against); every other output is stripped, because the book
build re-executes everything. Run after changing a notebook or the numbers it prints:

    .venv/bin/python tests/refresh_notebooks.py [NOTEBOOK ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
MARK = "NBVAL_CHECK_OUTPUT"


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)  # run timestamps: churn in every diff, no information
        if MARK not in cell.source:
            cell.outputs = []
            cell.execution_count = None  # nbval: a cell with outputs must have been run
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"refreshed {path.relative_to(ROOT)}")


if __name__ == "__main__":
    targets = [Path(p).resolve() for p in sys.argv[1:]] or sorted(
        (ROOT / "notebooks").glob("*.ipynb")
    )
    for target in targets:
        refresh(target)
