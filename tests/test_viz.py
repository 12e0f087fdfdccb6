"""Figures and panels on the Python side: every panel computes, renders statically, and
its values agree with the ledger; formatting rules that the browser mirrors."""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvlab import fmt
from kvlab.cli.budget import budget
from kvlab.book.catalog import panels
from kvlab.viz.panel import FORMATS, readout_html


def test_rounding_is_half_away_from_zero_on_the_exact_value():
    assert fmt.fixed(2.5, 0) == "3"
    assert fmt.fixed(1.125, 2) == "1.13"  # exactly representable tie
    assert fmt.fixed(1.005, 2) == "1.00"  # 1.005 is really 1.00499999...
    assert fmt.fixed(-0.0001, 2) == "0.00"
    assert fmt.fixed(1234567.891, 1) == "1,234,567.9"
    assert fmt.sig(999.96, 3) == "1,000"
    assert fmt.si(14.537e9, "B") == "14.5 GB" and fmt.seconds(0) == "0 s" and fmt.rate(137.5799) == "137.6"


@pytest.mark.parametrize("key", sorted(panels()))
def test_panel_defaults_render_and_match_their_own_readout_spec(key):
    panel = panels()[key]()
    out = panel.compute(panel.default_state)
    assert {k for k, _, _ in panel.readout} <= set(out["values"])
    html = panel.static_html()
    assert f'data-panel="{key}"' in html
    for control in panel.controls:
        assert f'"{key}.{control.key}"' in html  # every control is a named bokeh model
        assert control.default in control.options
    assert len(html) < 100_000  # keep each panel's embedded data small
    readout = readout_html(panel.readout, out["values"])
    for k, _label, kind in panel.readout:
        assert FORMATS[kind](out["values"][k]) in readout or "&" in readout


@pytest.mark.parametrize("key", sorted(panels()))
def test_panels_compute_on_every_grid_corner(key):
    panel = panels()[key]()
    sliders = [c for c in panel.controls if c.kind == "slider"]
    for corner in itertools.product(*[(c.options[0], c.options[-1]) for c in sliders]):
        state = {**panel.default_state, **{c.key: v for c, v in zip(sliders, corner)}}
        values = panel.compute(state)["values"]
        for v in values.values():
            if isinstance(v, float):
                assert np.isfinite(v)


def test_ledger_panel_values_are_the_cli_budget():
    panel = panels()["ledger"]()
    state = {**panel.default_state, "model": "mixtral-8x7b", "batch": 64, "kv_dtype": "fp8", "efficiency": 0.8}
    values = panel.compute(state)["values"]
    cli = budget(**panel.budget_keys(state))
    for key, _, _ in panel.readout:
        assert values[key] == cli[key]


def test_hit_panel_moves_ttft_not_tpot():
    panel = panels()["hits"]()
    low, high = panel.values(hit=0.0), panel.values(hit=0.95)
    assert high["ttft_s"] < low["ttft_s"] / 5
    assert high["step_time_s"] == low["step_time_s"]
    assert high["step_bytes"] == low["step_bytes"]
    full = panel.values(hit=1.0)
    assert full["cached_tokens"] == panel.default_state["context"] - 1  # the last token is computed


def test_knee_is_where_kv_reads_reach_the_weights():
    from kvlab import cost
    from kvlab.viz.controls import BATCH_GRID

    s = cost.decode_step("llama-3.1-8b", "h100-sxm", np.array(BATCH_GRID), 4096)
    k = cost.batch_knee(s)
    assert s.kv_read_bytes[k] >= s.weight_read_bytes > s.kv_read_bytes[k - 1]
    # at the knee throughput is within 2x of the bandwidth ceiling B/(K) for this context
    assert s.tokens_per_s[-1] / s.tokens_per_s[k] < 2


def test_tiers_figure_lists_every_tier():
    from kvlab.hardware import tiers
    from kvlab.viz.roofline import tiers_figure

    fig = tiers_figure()
    assert list(fig.y_range.factors)[::-1] == list(tiers())


def test_terms_are_json_and_small():
    from kvlab.viz.terms import ledger_terms
    from kvlab.hardware import devices
    from kvlab.models import models

    text = json.dumps(ledger_terms(models(), devices()))
    assert len(text) < 8000


# ------------------------------------------------ every legend entry is drawn
X_COORDS = ("x", "x0", "x1", "left", "right", "xs")
Y_COORDS = ("y", "y0", "y1", "top", "bottom", "ys")


def _columns_of(spec) -> list[str] | None:
    """The source columns a coordinate spec reads (a stack sums several); None: a constant."""
    from bokeh.core.property.vectorization import Expr, Field
    from bokeh.models import Stack

    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, Field):
        return [spec.field]
    if isinstance(spec, dict) and "field" in spec:
        return [spec["field"]]
    if isinstance(spec, Expr) and isinstance(spec.expr, Stack):
        return list(spec.expr.fields) or None  # an empty stack is the constant 0
    return None


def _drawable(value, log_axis: bool) -> bool:
    """A coordinate BokehJS can place: a category, or a finite number (positive on a log axis)."""
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, (list, tuple, np.ndarray)):  # multi_line / patches rows
        return len(value) > 0 and all(_drawable(v, log_axis) for v in value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and (number > 0 or not log_axis)


def legend_problems(layout) -> list[str]:
    """Legend entries with nothing to draw: every renderer of the entry reads a missing
    column, or has no row whose coordinates are all finite (positive on a log axis)."""
    from bokeh.models import Legend, LogScale, Plot

    problems = []
    for plot in layout.select({"type": Plot}):
        log = {"x": isinstance(plot.x_scale, LogScale), "y": isinstance(plot.y_scale, LogScale)}
        for legend in plot.select({"type": Legend}):
            for item in legend.items:
                label = (getattr(item.label, "value", None) or getattr(item.label, "field", None)
                         or item.label)
                reasons = [_renderer_problem(r, log) for r in item.renderers]
                if all(reasons):
                    title = plot.title.text if plot.title else "?"
                    problems.append(f"{title} / {label}: {'; '.join(reasons)}")
    return problems


def _renderer_problem(renderer, log: dict) -> str:
    """Why a glyph renderer draws nothing ('' when it draws something)."""
    data, glyph = renderer.data_source.data, renderer.glyph
    coords = []
    for name in glyph.dataspecs():
        if name not in X_COORDS + Y_COORDS:
            continue
        columns = _columns_of(getattr(glyph, name))
        if columns is None:
            continue
        missing = [c for c in columns if c not in data]
        if missing:
            return f"{type(glyph).__name__}.{name} reads missing column(s) {missing}"
        coords.append((name, columns, log["x" if name in X_COORDS else "y"]))
    rows = len(next(iter(data.values()), []))
    for i in range(rows):
        if all(_row_drawable(data, i, columns, log_axis) for _name, columns, log_axis in coords):
            return ""
    names = [n for n, _, _ in coords]
    return f"{type(glyph).__name__} has no row with drawable {names} ({rows} rows)"


def _row_drawable(data, i: int, columns: list[str], log_axis: bool) -> bool:
    values = [data[c][i] for c in columns]
    if len(values) == 1:
        return _drawable(values[0], log_axis)
    # a stack draws the running sum: each part finite, the sum positive on a log axis
    parts_finite = all(_drawable(v, False) for v in values)
    return parts_finite and _drawable(sum(float(v) for v in values), log_axis)


def _book_figures() -> list[tuple[str, str, str]]:
    """(notebook, the expression it shows, its imports) for every `show(...)` in the notebooks."""
    import ast

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        trees = [ast.parse("".join(c["source"])) for c in cells]
        imports = "\n".join(ast.unparse(n) for t in trees for n in ast.walk(t)
                            if isinstance(n, (ast.Import, ast.ImportFrom)))
        for tree in trees:
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show"
                        and len(node.args) == 1):
                    found.append((path.stem, ast.unparse(node.args[0]), imports))
    return found


@pytest.mark.parametrize("notebook, expression, imports", _book_figures(),
                         ids=lambda v: "" if "\n" in v else v)
def test_every_legend_entry_has_finite_data_to_draw(notebook, expression, imports):
    """Each figure the book shows, panels at their default state: a legend entry whose data
    are missing or all non-finite (a series the legend promises and the chart lacks) fails."""
    from bokeh.models import ColumnDataSource

    from kvlab.viz.panel import Panel

    namespace: dict = {}
    exec(imports, namespace)  # the notebook's own imports
    obj = eval(expression, namespace)
    if isinstance(obj, Panel):
        result = obj.compute(obj.default_state)
        obj = obj.figures({name: ColumnDataSource(d) for name, d in result["sources"].items()})
    assert legend_problems(obj) == [], f"{notebook}: {expression}"


def test_the_legend_check_sees_a_missing_series():
    """The class of the chapter 4 bug: the legend promises TTFT p50, the source lacks it."""
    from bokeh.models import ColumnDataSource

    from kvlab.viz.sim_panels import _paired_bars

    def problems(data):
        pair = (("ttft_p50_s", "p50"), ("ttft_p90_s", "p90"))
        return legend_problems(_paired_bars("TTFT", ColumnDataSource(data), *pair))

    full = {"arch": ["colocated"], "color": ["#000000"], "ttft_p50_s": [1.0], "ttft_p90_s": [2.0]}
    assert problems(full) == []
    lacking = {k: v for k, v in full.items() if k != "ttft_p50_s"}
    assert len(problems(lacking)) == 1 and "/ p50: " in problems(lacking)[0]
    assert len(problems({**full, "ttft_p50_s": [float("nan")]})) == 1
