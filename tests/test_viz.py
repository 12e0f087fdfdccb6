"""Figures and panels on the Python side: every panel computes, renders statically, and
its values agree with the ledger; formatting rules that the browser mirrors."""

import ast
import base64
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_js import covering_rows, measured_states

from kvlab import cost, fmt
from kvlab.book.catalog import panels
from kvlab.cli.budget import budget
from kvlab.deployment import Deployment, parse_speed
from kvlab.grids import BATCH_GRID, CONTEXT_GRID, DTYPE_CHOICES
from kvlab.hardware import devices, get_device, tiers
from kvlab.kernel_tables import kernels
from kvlab.models import get_model, models
from kvlab.viz import i18n, speed
from kvlab.viz.panel import FORMATS, Panel, readout_html
from kvlab.viz.terms import ledger_terms


def cli_budget(keys: dict) -> dict:
    """What `kvlab budget --json` prints for a panel's budget keys (its command-line options)."""
    d = Deployment(
        keys["model"],
        keys["hardware"],
        keys.get("weight_dtype", "fp16"),
        keys.get("kv_dtype", "fp16"),
        parse_speed(keys.get("efficiency", 1.0)),
    )
    return budget(d, keys["batch"], keys["context"], keys.get("cached", 0))


def test_rounding_is_half_away_from_zero_on_the_exact_value():
    assert fmt.fixed(2.5, 0) == "3"
    assert fmt.fixed(1.125, 2) == "1.13"  # exactly representable tie
    assert fmt.fixed(1.005, 2) == "1.00"  # 1.005 is really 1.00499999...
    assert fmt.fixed(-0.0001, 2) == "0.00"
    assert fmt.fixed(1234567.891, 1) == "1,234,567.9"
    assert fmt.sig(999.96, 3) == "1,000"
    assert (
        fmt.si(14.537e9, "B") == "14.5 GB"
        and fmt.seconds(0) == "0 s"
        and fmt.rate(137.5799) == "137.6"
    )


#: What a panel may add to its page (bytes of HTML, kvlab.js aside: the book ships it once
#: per site). The ledger panel draws what four panels drew, with the measured mode's terms.
PAGE_BYTES = {"ledger": 140_000}
PAGE_BYTES_DEFAULT = 100_000


@pytest.mark.parametrize("key", sorted(panels()))
def test_panel_defaults_render_and_match_their_own_readout_spec(key, monkeypatch):
    panel = panels()[key]()
    out = panel.compute(panel.default_state)
    assert {k for k, _, _ in panel.readout} | {k for k, _ in panel.glue} <= set(out["values"])
    monkeypatch.setenv("KVLAB_BOOK_BUILD", "1")  # as the book embeds it
    html = panel.static_html()
    assert f'data-panel="{key}"' in html
    for control in panel.controls:
        assert f'"{key}.{control.key}"' in html  # every control is a named bokeh model
        assert control.default in control.options
    assert len(html) < PAGE_BYTES.get(key, PAGE_BYTES_DEFAULT)  # keep each panel's data small
    readout = readout_html(panel.readout, out["values"])
    for k, _label, kind in panel.readout:
        assert FORMATS[kind](out["values"][k]) in readout or "&" in readout


@pytest.mark.parametrize("key", sorted(panels()))
def test_panels_compute_on_every_grid_corner(key):
    panel = panels()[key]()
    sliders = [c for c in panel.controls if c.kind == "slider"]
    for corner in itertools.product(*[(c.options[0], c.options[-1]) for c in sliders]):
        state = {**panel.default_state, **{c.key: v for c, v in zip(sliders, corner, strict=True)}}
        values = panel.compute(state)["values"]
        for v in values.values():
            if isinstance(v, float):
                assert np.isfinite(v)


@pytest.mark.parametrize("speed, efficiency_in_cli", [("ceiling", 0.8), ("measured", "measured")])
def test_ledger_panel_values_are_the_cli_budget(speed, efficiency_in_cli):
    panel = panels()["ledger"]()
    state = {
        **panel.default_state,
        "model": "mixtral-8x7b",
        "batch": 64,
        "kv_dtype": "fp8",
        "efficiency": 0.8,
        "speed": speed,
    }
    values = panel.compute(state)["values"]
    keys = panel.budget_keys(state)
    assert keys["efficiency"] == efficiency_in_cli
    cli = cli_budget(keys)
    shared = [key for key, _, _ in panel.readout if key in cli]
    assert len(shared) == 9
    for key in shared:
        assert values[key] == cli[key]
    if speed == "measured":
        assert values["speed"] == "measured: TRTLLM 1.3.0rc20 kernels"
        title = panel.compute(state)["titles"]["time"]  # the figure names its source
        tables = "TRTLLM 1.3.0rc20 kernel tables, NVIDIA H100 80GB HBM3"
        assert title == f"Time per step (measured: {tables})"
        assert values["step_time_s"] > values["ceiling_step_time_s"]  # real kernels are slower


def test_ledger_panel_sweeps_are_the_ledger_at_each_point():
    """The decode-step panel's knee, context and roofline values (chapter 2's prose quotes
    them) are kvlab.cost's, at the panel's state and over the shared grids."""
    panel = panels()["ledger"]()
    state = {**panel.default_state, "batch": 8}
    v = panel.compute(state)["values"]
    d = Deployment(state["model"], state["hardware"])
    sweep = cost.decode_step(d, np.array(BATCH_GRID), state["context"])
    assert v["knee_batch"] == BATCH_GRID[cost.batch_knee(sweep)]
    at = lambda ctx: cost.decode_step(d, 8, ctx).tokens_per_s_per_sequence  # noqa: E731
    assert v["at_4k"] == pytest.approx(at(4096)) and v["at_32k"] == pytest.approx(at(32768))
    assert v["slowdown"] == pytest.approx(at(4096) / at(32768))
    step = cost.decode_step(d, 8, state["context"])
    assert v["arithmetic_intensity"] == pytest.approx(step.arithmetic_intensity)
    # whole tokens: the longest context whose KV reads stay within the weights
    assert v["kv_equals_weights_context"] == step.weight_read_bytes // (8 * step.kv_bytes_per_token)


def test_ledger_panel_says_why_a_state_is_not_measured():
    """Measured mode where the tables have nothing: the ceiling, and one phrase saying why."""
    panel = panels()["ledger"]()
    cases = {
        ("rtx-4090", "llama-3.1-8b", "fp16", "fp16", 1, 4096): "no kernel tables for this device",
        ("h100-sxm", "deepseek-v3", "fp16", "fp16", 1, 4096): "no MLA attention tables",
        ("h100-sxm", "llama-3.1-8b", "int4", "fp16", 1, 4096): "no int4 weight tables",
        ("a100-80gb", "llama-3.1-8b", "fp16", "fp8", 1, 4096): "no fp8 KV tables",
        ("h100-sxm", "llama-3.1-8b", "fp16", "fp16", 1024, 131072): "outside the tables' range",
    }
    for (hw, model, w, kv, batch, context), why in cases.items():
        state = {
            **panel.default_state,
            "hardware": hw,
            "model": model,
            "weight_dtype": w,
            "kv_dtype": kv,
            "batch": batch,
            "context": context,
            "efficiency": 0.8,
            "speed": "measured",
        }
        out = panel.compute(state)
        ceiling = panel.compute({**state, "speed": "ceiling"})["values"]
        assert out["values"]["speed"] == f"ceiling × 80.0%: {why}"
        assert out["values"]["step_time_s"] == ceiling["step_time_s"]
        assert out["titles"]["time"] == "Time per step (ceiling × 80.0%)"
        assert panel.budget_keys(state)["efficiency"] == 0.8
    # a sweep the tables cover in part draws the measured points only, the ceiling beside them
    state = {**panel.default_state, "batch": 1024, "context": 16384, "speed": "measured"}
    sources = panel.compute(state)["sources"]
    assert 0 < len(sources["batch"]["batch"]) < len(sources["batch_ref"]["batch"]) == 17
    assert sources["batch"]["total_label"][0] == "whole batch (TRTLLM 1.3.0rc20 kernels)"


def test_measured_terms_add_up_to_the_measured_step_bit_for_bit():
    """The page's measured terms, added as js/speed.js adds them, are
    Kernels.decode_step_s exactly, for every configuration the tables cover, at grid points
    inside and outside their range (the node test then checks the JavaScript does this)."""

    terms = speed.measured_terms(models(), devices(), BATCH_GRID, CONTEXT_GRID)
    data = np.frombuffer(base64.b64decode(terms["data"]), "<f8")
    checked = 0
    for m, hw, w, kv in itertools.product(models(), devices(), DTYPE_CHOICES, DTYPE_CHOICES):
        if speed.why_not(m, hw, w, kv):
            continue
        k, mt, keys = kernels(m, hw, w, kv), terms["models"][m], terms["dtype_keys"]
        fixed = terms["fixed"][f"{m}|{hw}|{keys[w]}"][0]
        att = terms["attention"][f"{hw}|{mt['layout']}/{keys[kv]}"]
        bandwidth, peak = get_device(hw).memory_bandwidth_bytes_per_s, k.peak
        for i, b in list(enumerate(BATCH_GRID))[::4]:
            for j, c in list(enumerate(CONTEXT_GRID))[::3]:
                row = att[0] + sum(att[1 : 1 + i])
                per_layer = data[row + j] if j < att[1 + i] else math.nan
                floor = max(
                    b * (c + 1) * mt["kv_tok_layer"][keys[kv]] / bandwidth,
                    b * c * mt["attn_flops_layer"] / peak,
                )
                layers = get_model(m).num_layers
                got = float(data[fixed + i]) + layers * max(float(per_layer), floor)
                want = k.decode_step_s(b, c)
                same = got == want or (math.isnan(per_layer) and math.isnan(want))
                assert same, (m, hw, w, kv, b, c)
                checked += 1
    assert checked > 5000


def test_hit_panel_moves_ttft_not_tpot():
    panel = panels()["hits"]()
    low, high = panel.values(hit=0.0), panel.values(hit=0.95)
    assert high["ttft_s"] < low["ttft_s"] / 5
    assert high["step_time_s"] == low["step_time_s"]
    assert high["step_bytes"] == low["step_bytes"]
    full = panel.values(hit=1.0)
    assert full["cached_tokens"] == panel.default_state["context"] - 1  # the last token is computed


def test_knee_is_where_kv_reads_reach_the_weights():
    s = cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), np.array(BATCH_GRID), 4096)
    k = cost.batch_knee(s)
    assert s.kv_read_bytes[k] >= s.weight_read_bytes > s.kv_read_bytes[k - 1]
    # at the knee throughput is within 2x of the bandwidth ceiling B/(K) for this context
    assert s.tokens_per_s[-1] / s.tokens_per_s[k] < 2


def test_tiers_figure_lists_every_tier():
    from kvlab.viz.bandwidth_wall import tiers_figure  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    fig = tiers_figure()
    assert list(fig.y_range.factors)[::-1] == list(tiers())


def test_terms_are_json_and_small():
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
    column, or has no row whose coordinates are all finite (positive on a log axis). An
    entry labelled by a column (legend_field) is one entry per value of that column, as
    BokehJS draws it: none at all when the sources have no rows, and each value must have a
    drawable row of its own."""
    return LegendCheck(layout).problems()


class LegendCheck:
    """legend_problems, with the figures read once: `problems()` then checks whatever data
    the sources hold now (the grid test swaps the data state by state)."""

    def __init__(self, layout):
        from bokeh.models import Legend, LogScale, Plot

        self.items = []  # (figure title, label text or None, field or None, [(renderer, coords)])
        for plot in layout.select({"type": Plot}):
            log = {"x": isinstance(plot.x_scale, LogScale), "y": isinstance(plot.y_scale, LogScale)}
            title = plot.title.text if plot.title else "?"
            for legend in plot.select({"type": Legend}):
                for item in legend.items:
                    field = getattr(item.label, "field", None)
                    if field is None and isinstance(item.label, dict):
                        field = item.label.get("field")
                    label = None if field else (getattr(item.label, "value", None) or item.label)
                    renderers = [(r, _coordinates(r.glyph, log)) for r in item.renderers]
                    self.items.append((title, label, field, renderers))

    def problems(self) -> list[str]:
        out = []
        for title, label, field, renderers in self.items:
            if field:
                out += _field_item_problems(title, field, renderers)
                continue
            reasons = [_renderer_problem(r, coords) for r, coords in renderers]
            if all(reasons):
                out.append(f"{title} / {label}: {'; '.join(reasons)}")
        return out


def _coordinates(glyph, log: dict) -> list[tuple]:
    """(name, columns it reads, on a log axis) of each data coordinate of a glyph."""
    coords = []
    for name in glyph.dataspecs():
        if name not in X_COORDS + Y_COORDS:
            continue
        columns = _columns_of(getattr(glyph, name))
        if columns is not None:
            coords.append((name, columns, log["x" if name in X_COORDS else "y"]))
    return coords


def _field_item_problems(title: str, field: str, renderers) -> list[str]:
    """A legend_field item: one entry per value of `field`; each needs a drawable row."""
    values: dict = {}
    for r, coords in renderers:
        for i, v in enumerate(r.data_source.data.get(field, [])):
            values.setdefault(v, {}).setdefault((r, id(coords)), (r, coords, []))[2].append(i)
    problems = []
    for value, rows in values.items():
        reasons = [_renderer_problem(r, coords, only=i) for r, coords, i in rows.values()]
        if all(reasons):
            problems.append(f"{title} / {value}: {'; '.join(reasons)}")
    return problems


def _renderer_problem(renderer, coords, only: list[int] | None = None) -> str:
    """Why a glyph renderer draws nothing ('' when it draws something); `only`: these rows."""
    data, glyph = renderer.data_source.data, renderer.glyph
    for name, columns, _log in coords:
        missing = [c for c in columns if c not in data]
        if missing:
            return f"{type(glyph).__name__}.{name} reads missing column(s) {missing}"
    rows = only if only is not None else range(len(next(iter(data.values()), [])))
    for i in rows:
        if all(_row_drawable(data, i, columns, log_axis) for _name, columns, log_axis in coords):
            return ""
    names = [n for n, _, _ in coords]
    return f"{type(glyph).__name__} has no row with drawable {names} ({len(rows)} rows)"


def _row_drawable(data, i: int, columns: list[str], log_axis: bool) -> bool:
    values = [data[c][i] for c in columns]
    if len(values) == 1:
        return _drawable(values[0], log_axis)
    # a stack draws the running sum: each part finite, the sum positive on a log axis
    parts_finite = all(_drawable(v, False) for v in values)
    return parts_finite and _drawable(sum(float(v) for v in values), log_axis)


def _book_figures() -> list[tuple[str, str, str]]:
    """(notebook, the expression it shows, its imports) for every `show(...)` in the notebooks."""

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        trees = [ast.parse("".join(c["source"])) for c in cells]
        imports = "\n".join(
            ast.unparse(n)
            for t in trees
            for n in ast.walk(t)
            if isinstance(n, (ast.Import, ast.ImportFrom))
        )
        for tree in trees:
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "show"
                    and len(node.args) == 1
                ):
                    found.append((path.stem, ast.unparse(node.args[0]), imports))
    return found


@pytest.mark.parametrize(
    "notebook, expression, imports", _book_figures(), ids=lambda v: "" if "\n" in v else v
)
def test_every_legend_entry_has_finite_data_to_draw(notebook, expression, imports):
    """Each figure the book shows, panels at their default state: a legend entry whose data
    are missing or all non-finite (a series the legend promises and the chart lacks) fails."""
    from bokeh.models import ColumnDataSource

    namespace: dict = {}
    exec(imports, namespace)  # the notebook's own imports
    obj = eval(expression, namespace)
    if isinstance(obj, Panel):
        result = obj.compute(obj.default_state)
        obj = obj.figures({name: ColumnDataSource(d) for name, d in result["sources"].items()})
    assert legend_problems(obj) == [], f"{notebook}: {expression}"


def legend_states(panel) -> list[dict]:
    """The states whose figures the legend check draws: a panel's whole grid when small,
    else every pair of controls in every combination of their options (plus the default);
    for the ledger panel, every configuration the kernel tables cover, measured."""

    keys = [c.key for c in panel.controls]
    options = [c.options for c in panel.controls]
    if math.prod(len(o) for o in options) <= 4000:
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]
    rows = covering_rows([len(o) for o in options], strength=2)
    states = [panel.default_state] + [
        {k: o[i] for k, o, i in zip(keys, options, row, strict=True)} for row in rows
    ]
    return states + (measured_states(panel) if panel.key == "ledger" else [])


@pytest.mark.parametrize("key", sorted(panels()))
def test_every_legend_entry_has_data_in_every_state(key):
    """The legend check over a panel's grid, not only its default state: an entry the
    legend shows must have data to draw whatever the controls say (the weights overflow the
    device, the kernel tables do not cover the state, ...)."""
    from bokeh.models import ColumnDataSource

    panel = panels()[key]()
    first = panel.compute(panel.default_state)
    sources = {name: ColumnDataSource(data) for name, data in first["sources"].items()}
    check = LegendCheck(panel.figures(sources))
    bad = []
    for state in legend_states(panel):
        for name, data in panel.compute(state)["sources"].items():
            sources[name].data = data
        bad += [f"{state}: {p}" for p in check.problems()]
        if len(bad) >= 5:
            break
    assert bad == []


def test_texts_that_only_some_states_show_have_their_chinese():
    """Words a panel shows only in some states (the measured mode's legends, titles and
    phrases, the limit that binds the batch) are in the Chinese table too; tests/test_i18n.py
    checks every panel's default state."""

    texts = set()
    for key in ("ledger", "tier-read", "tpot-budget", "footprint", "pd"):
        panel = panels()[key]()
        states = legend_states(panel)
        if key == "ledger":
            states = states[::10] + measured_states(panel)[::3]
        for state in states:
            out = panel.compute(state)
            texts |= {
                FORMATS[kind](out["values"][k])
                for k, _label, kind in panel.readout
                if kind == "text"
            }
            texts |= set(out.get("titles", {}).values())
            for _name, data in out["sources"].items():
                texts |= {
                    v
                    for col, values in data.items()
                    if col not in i18n.HIDDEN_COLUMNS
                    for v in values
                    if isinstance(v, str)
                }
    assert i18n.missing(texts) == [], f"add these to {i18n.CATALOGUE}"


def test_footprint_draws_no_room_when_the_weights_overflow_the_device():
    panel = panels()["footprint"]()
    state = {**panel.default_state, "model": "llama-3.1-70b", "hardware": "h100-sxm"}
    out = panel.compute(state)
    assert out["values"]["weights_fit"] is False and out["values"]["room_bytes"] == 0.0
    assert out["values"]["max_batch_4k"] == 0 and out["sources"]["room"]["room"] == []
    assert panel.values()["weights_fit"] is True
    assert len(panel.compute(panel.default_state)["sources"]["room"]["room"]) == 10


def test_tpot_budget_keeps_the_slo_and_the_memory_limit_apart():
    """Pitfall 1: at 8K tokens on an H100 a 50 ms budget would allow far more sequences than
    fit in memory; memory sets the batch, and TPOT there is well within the budget."""
    panel = panels()["tpot-budget"]()
    v = panel.values()
    m, hw, ctx, slo = (panel.default_state[k] for k in ("model", "hardware", "context", "slo"))
    d = Deployment(m, hw)
    step = lambda b: cost.decode_step(d, b, ctx).step_time_s  # noqa: E731
    assert step(v["tpot_batch"]) <= slo < step(v["tpot_batch"] + 1)  # the budget's exact edge
    assert v["max_batch"] == cost.memory_fit(d, 1, ctx).max_batch
    assert v["max_batch"] < v["tpot_batch"] and v["limited_by"] == "device memory"
    assert v["allowed_batch"] == v["max_batch"] and v["allowed_tpot_s"] < 0.5 * slo
    tight = panel.values(slo=0.02)  # a tight budget: now the budget sets the batch
    assert tight["limited_by"] == "TPOT budget" and tight["allowed_batch"] == tight["tpot_batch"]
    none = panel.values(model="llama-3.1-70b")  # fp16 70B does not fit one H100 at all
    assert none["max_batch"] == 0 and none["allowed_batch"] == 0
    assert none["limited_by"] == "device memory"
    assert none["allowed_tpot_s"] != none["allowed_tpot_s"]  # NaN: nothing runs


def test_the_legend_check_sees_a_missing_series():
    """The class of the chapter 4 bug: the legend promises TTFT p50, the source lacks it."""
    from bokeh.models import ColumnDataSource

    from kvlab.viz.kv_centric import _paired_bars  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    def problems(data):
        pair = (("ttft_p50_s", "p50"), ("ttft_p90_s", "p90"))
        return legend_problems(_paired_bars("TTFT", ColumnDataSource(data), *pair))

    full = {"arch": ["colocated"], "color": ["#000000"], "ttft_p50_s": [1.0], "ttft_p90_s": [2.0]}
    assert problems(full) == []
    lacking = {k: v for k, v in full.items() if k != "ttft_p50_s"}
    assert len(problems(lacking)) == 1 and "/ p50: " in problems(lacking)[0]
    assert len(problems({**full, "ttft_p50_s": [float("nan")]})) == 1


def test_the_legend_check_reads_legend_fields_as_bokehjs_does():
    """An entry labelled by a column is absent with no rows, and fails with rows that
    cannot be drawn (a log axis at zero)."""
    from bokeh.models import ColumnDataSource

    from kvlab.viz import style  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    fig = style.new_figure("t", "x", "y", y_axis_type="log")
    src = ColumnDataSource({"x": [], "y": [], "label": []})
    fig.line("x", "y", source=src, legend_field="label")
    assert legend_problems(fig) == []
    src.data = {"x": [1.0, 2.0], "y": [0.0, 0.0], "label": ["room", "room"]}
    assert legend_problems(fig) == ["t / room: Line has no row with drawable ['x', 'y'] (2 rows)"]
    src.data = {"x": [1.0, 2.0], "y": [0.0, 3.0], "label": ["room", "room"]}
    assert legend_problems(fig) == []
