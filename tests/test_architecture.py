"""The package's shape, enforced: three layers, imports one way, no cycles, and the
numeric core importable with numpy alone (see ARCHITECTURE.md).

1. data and model: hardware, models, dtypes, cost, measured tables and the small shared
   rules (errors, fmt, prompt, grids, jsonsafe, article);
2. domain: tiers, traces, prefix, sim, decoder, bench, kv_transfer, diagnose, metrics, native;
3. presentation: book, viz, labs, cli.
Every import counts, including the ones inside functions.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kvlab"
PRESENTATION = {"book", "viz", "labs", "cli", "__main__"}
DOMAIN = {
    "tiers",
    "traces",
    "prefix",
    "sim",
    "decoder",
    "bench",
    "kv_transfer",
    "diagnose",
    "metrics",
    "native",
    "plan",
}
GUI = ("bokeh", "ipywidgets", "IPython", "myst_nb", "jupyter_bokeh", "voila")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names}
            found = {s for s in subs if _is_module(s)}
            out.update(found)  # `from pkg import submodule` imports the submodule ...
            if len(found) < len(subs):
                out.add(mod)  # ... `from pkg import name` the package (or module) itself
    return out


def _is_module(name: str) -> bool:
    parts = name.split(".")
    path = ROOT.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


@functools.cache
def graph() -> dict[str, set[str]]:
    """{module: the kvlab modules it imports}, parsed when a test first asks (not while every
    pytest worker collects this file)."""
    return {m: {i for i in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def _unit(module: str) -> str:
    """kvlab.sim.cluster -> sim; kvlab.cost -> cost."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    return 3 if unit in PRESENTATION else 2 if unit in DOMAIN else 1


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of a directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


#: Layer 1, data and model: catalogues, the ledger and the small shared rules.
DATA_AND_MODEL = {
    "hardware",
    "models",
    "dtypes",
    "cost",
    "operators",
    "ledger_rows",
    "deployment",
    "errors",
    "fmt",
    "prompt",
    "grids",
    "published",
    "jsonsafe",
    "article",
    "kernel_tables",
    "parallel",
    "speculative",
}
LAYERS = (
    ("presentation", PRESENTATION - {"__main__"}),
    ("domain", DOMAIN),
    ("data and model", DATA_AND_MODEL),
)
PICTURE_BEGIN, PICTURE_END = "<!-- layers: generated -->", "<!-- /layers -->"


def layer_picture(width: int = 88) -> str:
    """ARCHITECTURE.md's picture of the layers, drawn from the sets this test enforces."""
    lines = []
    for i, (name, units) in enumerate(LAYERS):
        row, words = f"{name:<15}", sorted(units)
        for word in words:
            if len(row) + len(word) + 1 > width and row.strip():
                lines.append(row.rstrip())
                row = " " * 15
            row += word + " "
        lines.append(row.rstrip())
        if i < len(LAYERS) - 1:
            lines.append(" " * 15 + "|")
    return "\n".join(["```", *lines, "```"])


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES} - {"__init__"}
    known = PRESENTATION | DOMAIN | DATA_AND_MODEL
    assert units <= known, units - known
    assert not (PRESENTATION & DOMAIN or DOMAIN & DATA_AND_MODEL or PRESENTATION & DATA_AND_MODEL)


def test_architecture_md_draws_the_layers_this_test_enforces():
    """ARCHITECTURE.md's picture is generated: `python tests/test_architecture.py` rewrites it."""
    text = (ROOT.parent / "ARCHITECTURE.md").read_text()
    start, end = text.index(PICTURE_BEGIN) + len(PICTURE_BEGIN), text.index(PICTURE_END)
    assert text[start:end].strip() == layer_picture(), (
        "ARCHITECTURE.md's layer picture is stale: run `python tests/test_architecture.py`"
    )


def test_no_import_cycle_between_modules():
    assert _cycle(graph()) is None, " -> ".join(_cycle(graph()))


def test_no_import_cycle_between_packages():
    units: dict[str, set[str]] = {}
    for m, deps in graph().items():
        units.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    units.pop("__init__", None)
    assert _cycle(units) is None, " -> ".join(_cycle(units))


def test_imports_point_down_the_layers():
    wrong = [
        (m, d)
        for m, deps in graph().items()
        for d in deps
        if _unit(m) != "__init__" and _layer(_unit(d)) > _layer(_unit(m))
    ]
    assert not wrong, wrong


def test_only_presentation_imports_notebook_and_plotting_libraries():
    wrong = [
        (m, i)
        for m, p in MODULES.items()
        if _layer(_unit(m)) < 3
        for i in _imports(p)
        if i.split(".")[0] in GUI
    ]
    assert not wrong, wrong


def test_only_the_book_knows_chapters():
    wrong = [
        m for m in MODULES if "chapter" in m.rsplit(".", 1)[-1] and not m.startswith("kvlab.book")
    ]
    wrong += [
        m
        for m, deps in graph().items()
        if not _unit(m) == "book" and any(_unit(d) == "book" for d in deps)
    ]
    assert not wrong, wrong


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is blocked: this module must import with numpy alone")
sys.meta_path.insert(0, Block())
import {module}
"""


@pytest.mark.parametrize(
    "module",
    [
        "kvlab.cost",
        "kvlab.labs",
        "kvlab.sim",
        "kvlab.prefix",
        "kvlab.tiers",
        "kvlab.traces",
        "kvlab.diagnose",
        "kvlab.cli",
    ],
)
def test_numeric_core_imports_with_numpy_alone(module):
    blocked = {"torch", "bokeh", "ipywidgets", "IPython", "myst_nb", "pandas", "scipy"}
    code = BLOCKER.format(blocked=blocked, module=module)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


#: The ledger's counts, written as code: the causal pair count (`n * (n + 1) / 2` and its
#: kin) and the expert touch (`1 - k / E` raised to the tokens).
PRICING = re.compile(
    r"\(\s*[A-Za-z_][\w.]*\s*[+-]\s*1\s*\)\s*/\s*2"
    r"|experts_per_token\s*/\s*[\w.]*num_experts"
)
#: Where they may be written: the ledger's table, and its browser twin (tests/test_js.py
#: holds the twin to it).
PRICING_HOMES = {"kvlab/operators.py", "kvlab/viz/js/kvlab.js"}


def test_the_ledger_is_written_once():
    """A second pricing of a pass (a pair count or an expert touch written again outside
    the table) fails here: every step, verify pass, prefill and simulator iteration must
    evaluate `kvlab.operators`."""
    found = []
    for path in sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.js")]):
        name = path.relative_to(ROOT.parent).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if path.suffix == ".py" else line.split("//", 1)[0]
            if PRICING.search(code) and name not in PRICING_HOMES:
                found.append(f"{name}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
    for home in PRICING_HOMES:
        assert PRICING.search((ROOT.parent / home).read_text()), home


if __name__ == "__main__":  # rewrite ARCHITECTURE.md's picture from the sets above
    doc = ROOT.parent / "ARCHITECTURE.md"
    text = doc.read_text()
    start, end = text.index(PICTURE_BEGIN) + len(PICTURE_BEGIN), text.index(PICTURE_END)
    doc.write_text(text[:start] + "\n" + layer_picture() + "\n" + text[end:])
