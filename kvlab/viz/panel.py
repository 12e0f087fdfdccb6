"""A panel: controls + figures + a readout, with a static face and a live face.

A panel is described once: its controls (with the grid of values the static page offers),
a Python `compute(state)` that asks kvlab for everything the figures and readout show,
the name of its JavaScript twin for the static page (a function in kvlab/viz/js/*.js,
registered as `KVLAB.panels[name] = function (K, T, s)`, that may only look up or combine
the `terms` kvlab computed at build time), and a figure builder that draws from named
ColumnDataSources. The static face embeds the default state computed in Python and lets
the JS recompute on change; the live face calls `compute` on every change for any value.
tests/test_js.py runs every twin under node against `compute` over the panel's grid.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

from .. import fmt
from ..jsonsafe import jsonable
from . import i18n
from .layout import control_width, fit

BOOK_BUILD_ENV = "KVLAB_BOOK_BUILD"

#: Readout formatters by kind; kvlab/viz/js/kvlab.js FORMATS is the browser twin.
FORMATS: dict[str, Callable] = {
    "bytes": lambda v: fmt.si(v, "B"),
    "bytes_per_s": lambda v: fmt.si(v, "B/s"),
    "flops": lambda v: fmt.si(v, "FLOP"),
    "flops_per_s": lambda v: fmt.si(v, "FLOP/s"),
    "seconds": fmt.seconds,
    "rate": fmt.rate,
    "percent": fmt.percent,
    "count": lambda v: fmt.fixed(v, 0),
    "count_or_never": lambda v: "never" if v is None else fmt.fixed(v, 0),  # None: unbounded
    # None or infinity: a sliding window caps the KV, so no context is too long
    "count_or_unbounded": lambda v: (
        "unbounded" if v is None or not math.isfinite(v) else fmt.fixed(v, 0)
    ),
    "ratio": lambda v: "n/a" if v is None or not math.isfinite(v) else f"{fmt.sig(v, 3)}×",
    "intensity": lambda v: f"{fmt.sig(v, 3)} FLOP/B",
    "yesno": lambda v: "yes" if v else "no",
    "text": str,
}


JS_LIBRARY = "kvlab.js"  # formatting, the ledger's scalar twin, panel plumbing: loaded first


def js_files() -> list[str]:
    """kvlab/viz/js/*.js in load order: the library, then the panels' files by name."""
    folder = resources.files("kvlab.viz").joinpath("js")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".js"))
    return [JS_LIBRARY, *(n for n in names if n != JS_LIBRARY)]


def kvlab_js() -> str:
    """Everything the static panels run in the browser, as one script (the library, then
    every panel's function); the book ships it once per site, notebooks inline it."""
    folder = resources.files("kvlab.viz").joinpath("js")
    return "\n".join(folder.joinpath(name).read_text() for name in js_files())


def readout_html(spec, values: dict) -> str:
    """The readout as a two-column table; each value carries its exact number for tests and
    its format kind (a phrase, kind "text", may wrap; a number never does)."""
    parts = ['<table class="kvlab-readout">']
    for key, label, kind in spec:
        value = values[key]
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # as a page sees it (JSON has no infinity)
        raw = (
            repr(float(value))
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else str(value)
        )
        if isinstance(value, bool):
            raw = "true" if value else "false"
        parts.append(  # the words in the edition's language (i18n.t), the data-value as computed
            f'<tr><th>{html.escape(i18n.t(label))}</th><td data-key="{key}" '
            f'data-value="{html.escape(raw)}" data-kind="{kind}">'
            f"{html.escape(i18n.t(FORMATS[kind](value)))}</td></tr>"
        )
    parts.append("</table>")
    return "".join(parts)


@dataclass(frozen=True)
class Control:
    """One input of a panel. Static pages offer `options`; live widgets may offer a range."""

    key: str  # state key; for ledger panels the `kvlab budget` option it stands for
    label: str
    options: tuple  # select: the values; slider: the grid of values the static page offers
    default: object
    kind: str = "select"  # "select" or "slider"
    option_labels: tuple | None = None  # display names for a select's values
    unit: str = ""  # appended to a slider's displayed value
    live_range: tuple | None = None  # (low, high): the live widget takes any value between
    log: bool = False
    integer: bool = True

    def label_of(self, value) -> str:
        if self.option_labels:
            return dict(zip(self.options, self.option_labels, strict=True)).get(value, str(value))
        if isinstance(value, float) and not value.is_integer():
            return f"{fmt.sig(value, 3)}{self.unit}"
        return f"{fmt.fixed(value, 0) if isinstance(value, (int, float)) else value}{self.unit}"


@dataclass
class Panel:
    """Controls + figures + readout; see the module docstring."""

    key: str  # unique on its page; prefixes every bokeh model name
    controls: tuple[Control, ...]
    compute: Callable[[dict], dict]  # state -> {"sources": {name: columns}, "values": {...}}
    figures: Callable[[dict], object]  # {name: ColumnDataSource} -> a bokeh layout
    js: str  # name of its twin in KVLAB.panels (kvlab/viz/js/*.js); "" for a live-only panel
    terms: dict = field(default_factory=dict)  # build-time numbers the JS may combine
    readout: tuple = ()  # (key, label, format kind)
    budget_keys: Callable[[dict], dict] | None = None  # state -> kvlab budget kwargs (tests)
    glue: tuple = ()  # (key, format kind): values the prose quotes that the readout does not show

    @property
    def default_state(self) -> dict:
        return {c.key: c.default for c in self.controls}

    def values(self, **state) -> dict:
        """The readout values for the default state (overridden by `state`)."""
        return self.compute({**self.default_state, **state})["values"]

    def readout_texts(self, prefix: str | None = None, **state) -> dict[str, str]:
        """Every readout value (and every `glue` value) formatted as the readout would show
        it, keyed for the prose: {"<prefix>_<key>": text} (prefix: the panel's key), at the
        default state overridden by `state`."""
        values = self.values(**state)
        kinds = [(key, kind) for key, _label, kind in self.readout] + list(self.glue)
        return {f"{prefix or self.key}_{key}": FORMATS[kind](values[key]) for key, kind in kinds}

    # ------------------------------------------------------------------ static
    def static_html(self) -> str:
        """Bokeh components for the built book: the default state drawn by Python."""
        from bokeh.embed import components
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, CustomJS, Div, InlineStyleSheet

        if not self.js:
            raise ValueError(f"panel {self.key!r} is live only (it has no JavaScript twin)")
        result = self.compute(self.default_state)
        sources = {
            name: ColumnDataSource(data=data, name=f"{self.key}.source.{name}")
            for name, data in result["sources"].items()
        }
        widgets, grids = _static_widgets(self.key, self.controls)
        readout = Div(
            text=readout_html(self.readout, result["values"]),
            name=f"{self.key}.readout",
            sizing_mode="stretch_width",
            stylesheets=[InlineStyleSheet(css=CSS)],
        )
        figures = self.figures(sources)
        titles = _titles(figures, result)
        for name, text in result.get("titles", {}).items():  # as the first change would set it
            titles[name].text = text
        callback = CustomJS(
            args=dict(
                controls=widgets,
                grids=grids,
                terms=self.terms,
                sources=sources,
                readout=readout,
                spec=[list(r) for r in self.readout],
                titles=titles,
            ),
            code=f"const K = window.KVLAB, twin = K.panels[{json.dumps(self.js)}];\n"
            "const result = twin(K, terms, K.state(controls, grids));\n"
            "K.apply(result, sources, readout, spec, titles);",
        )
        for c in self.controls:
            widgets[c.key].js_on_change("value", callback)
        # controls flow in rows as wide as the column, the readout below them, then the
        # figures (kvlab.viz.layout): at 1280 px three controls a row, on a phone one
        controls = row(*widgets.values(), styles=CONTROL_ROW_STYLES)
        layout = fit(i18n.localize(column(controls, readout, figures)))
        script, div = components(layout)
        meta = {c.key: {"options": list(c.options), "kind": c.kind} for c in self.controls}
        return (
            f'<div class="kvlab-panel" data-panel="{self.key}" '
            f'data-controls="{html.escape(json.dumps(meta))}">'
            f"{_library_script()}{div}{script}</div>"
        )

    # -------------------------------------------------------------------- live
    def live(self):
        """ipywidgets controls driving the same figures from the Python ledger."""
        return self.live_view().box

    def live_view(self) -> LiveView:
        """The live face and its parts: the box to display, the widgets by control key, and
        the state they stand for (a page that adds to the panel reads it)."""
        import ipywidgets as w
        from bokeh.models import ColumnDataSource
        from jupyter_bokeh import BokehModel

        _ensure_live_resources()
        result = self.compute(self.default_state)
        sources = {name: ColumnDataSource(data=data) for name, data in result["sources"].items()}
        readout = w.HTML(
            readout_html(self.readout, result["values"]), layout=w.Layout(width="100%")
        )
        boxes = {c.key: _live_control(c) for c in self.controls}
        widgets = {key: box.children[1] for key, box in boxes.items()}

        def state() -> dict:
            return {
                k: _live_value(c, widgets[k].value)
                for k, c in zip(widgets, self.controls, strict=True)
            }

        def update(_change=None):
            try:
                out = self.compute(state())
            except ValueError as exc:  # KvlabError: say it in the readout, keep the figure
                readout.value = f'<p class="kvlab-error">{html.escape(str(exc))}</p>'
                return
            for name, data in out["sources"].items():
                sources[name].data = data
            for name, text in out.get("titles", {}).items():
                titles[name].text = i18n.t(text)
            readout.value = readout_html(self.readout, out["values"])

        for widget in widgets.values():
            widget.observe(update, "value")
        controls = w.Box(list(boxes.values()), layout=w.Layout(**LIVE_ROW))
        figures = self.figures(sources)
        titles = _titles(figures, result)
        box = w.VBox([controls, readout, BokehModel(fit(i18n.localize(figures)))])
        return LiveView(box, widgets, state)


@dataclass
class LiveView:
    """A panel's live face: what to display, its widgets by control key, its state."""

    box: object
    widgets: dict
    state: Callable[[], dict]


def _static_widgets(key: str, controls) -> tuple[dict, dict]:
    """The static page's bokeh widgets ({control key: widget}) and their option grids."""
    from bokeh.models import CustomJSTickFormatter, Select, Slider

    widgets, grids = {}, {}
    for c in controls:
        name = f"{key}.{c.key}"
        if c.kind == "slider":
            grids[c.key] = list(c.options)
            labels = [c.label_of(v) for v in c.options]
            widgets[c.key] = Slider(
                start=0,
                end=len(c.options) - 1,
                step=1,
                value=c.options.index(c.default),
                title=c.label,
                name=name,
                width=CONTROL_WIDTH_PX,
                format=CustomJSTickFormatter(
                    code=f"return {json.dumps(labels)}[Math.round(tick)];"
                ),
            )
        else:  # values are option indices: options need not be strings (JS maps them back)
            grids[c.key] = list(c.options)
            options = [(str(i), c.label_of(v)) for i, v in enumerate(c.options)]
            widgets[c.key] = Select(
                title=c.label,
                value=str(c.options.index(c.default)),
                options=options,
                name=name,  # wide enough for its longest option in the edition's language
                width=control_width([i18n.t(label) for _, label in options], CONTROL_WIDTH_PX),
            )
    return widgets, grids


#: Width of a static control: the longest device name ("NVIDIA B200 (HGX, 180 GB)") fits,
#: and three controls a row fit the book column at 1280 px (688 px).
CONTROL_WIDTH_PX = 216
#: The controls' row wraps at the column's width.
CONTROL_ROW_STYLES = {"flex-wrap": "wrap", "column-gap": "12px", "row-gap": "2px"}


def _titles(figures, result: dict) -> dict:
    """The Title models of the figures whose titles `compute` sets (result["titles"], keyed
    by the figure's bokeh name): a title can name where its numbers come from."""
    from bokeh.models import Plot

    named = {plot.name: plot.title for plot in figures.select({"type": Plot}) if plot.name}
    missing = set(result.get("titles", {})) - set(named)
    if missing:
        raise ValueError(f"compute sets the titles of figures it does not draw: {sorted(missing)}")
    return {name: named[name] for name in result.get("titles", {})}


#: The live controls flow in rows as wide as the page, like the static page's.
LIVE_ROW = {"display": "flex", "flex_flow": "row wrap", "grid_gap": "4px 16px", "width": "100%"}
LIVE_CONTROL_WIDTH = "300px"


def _live_control(c: Control):
    """A live control: its whole label above it (a description beside a widget is cut short
    by ipywidgets), then the widget."""
    import ipywidgets as w

    label = w.HTML(f'<div class="kvlab-label">{html.escape(i18n.t(c.label))}</div>')
    box = w.VBox([label, _live_widget(c)], layout=w.Layout(width=LIVE_CONTROL_WIDTH))
    box.add_class(f"kvlab-control-{c.key}")  # tests find a control by its key
    return box


def _live_widget(c: Control):
    import ipywidgets as w

    layout = w.Layout(width="100%")
    if c.kind == "select":
        options = [(c.label_of(v), v) for v in c.options]
        return w.Dropdown(options=options, value=c.default, layout=layout)
    if c.live_range and c.log:
        low, high = (math.log2(v) for v in c.live_range)
        return w.FloatLogSlider(
            value=c.default,
            base=2,
            min=low,
            max=high,
            step=0.01,
            readout_format=".0f" if c.integer else ".3g",
            layout=layout,
        )
    if c.live_range:
        if c.integer:
            return w.IntSlider(c.default, min=c.live_range[0], max=c.live_range[1], layout=layout)
        return w.FloatSlider(  # any value to the hundredth, not ipywidgets' tenth
            c.default, min=c.live_range[0], max=c.live_range[1], step=0.01, layout=layout
        )
    return w.SelectionSlider(
        options=[(c.label_of(v), v) for v in c.options], value=c.default, layout=layout
    )


def _live_value(c: Control, value):
    return (
        int(round(value))
        if c.kind == "slider" and c.integer and isinstance(value, float)
        else value
    )


_LIVE_READY = False


def _ensure_live_resources() -> None:
    """Load BokehJS (inline: no CDN) and kvlab.js into the notebook page once."""
    global _LIVE_READY
    if _LIVE_READY:
        return
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE
    from IPython.display import HTML, Javascript, display

    output_notebook(INLINE, hide_banner=True)
    display(Javascript(kvlab_js()))
    display(HTML(f"<style>{CSS}</style>"))
    _LIVE_READY = True


#: The readout: label and value on one line, in two columns where the column is wide enough
#: (at 1280 px), one on a phone; a label wraps, a value never does (but a phrase may).
CSS = """
.kvlab-readout { display: block; columns: 2 17em; column-gap: 28px; margin: 6px 0; max-width: 64em;
  font-size: 13px; line-height: 1.35; }
.kvlab-readout tbody { display: block; }
.kvlab-readout tr { display: flex; align-items: baseline; justify-content: space-between;
  gap: 12px; break-inside: avoid; padding: 1px 0; border-bottom: 1px solid #f0f0f0; }
.kvlab-readout th { color: #555; font-weight: normal; text-align: left; flex: 1 1 auto;
  min-width: 0; }
.kvlab-readout td { font-variant-numeric: tabular-nums; font-weight: 600; text-align: right;
  white-space: nowrap; flex: 0 0 auto; }
.kvlab-readout td[data-kind="text"] { white-space: normal; flex: 0 1 auto; min-width: 7em; }
.kvlab-error { color: #D55E00; }
.kvlab-label { font-size: 13px; line-height: 1.3; color: #333; }
"""


class StaticHTML:
    """An HTML fragment for the built book (myst-nb renders `text/html`)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return self.text


def static_figure_html(layout) -> str:
    """A figure without controls, for the built book."""
    from bokeh.embed import components

    script, div = components(fit(layout))
    return f"{_library_script()}{div}{script}"


def _library_script() -> str:
    """kvlab.js inline, except in the built book, which ships it once per site (book/_ext)."""
    return "" if is_book_build() else f"<script>{kvlab_js()}</script>"


def is_book_build() -> bool:
    return os.environ.get(BOOK_BUILD_ENV) == "1"


def show(obj) -> None:
    """Display a Panel or a bokeh layout: static while building the book, live otherwise."""
    from IPython.display import display

    if isinstance(obj, Panel):
        display(StaticHTML(obj.static_html()) if is_book_build() else obj.live())
        return
    obj = i18n.localize(obj)  # the edition's language (a no-op in English)
    if is_book_build():
        display(StaticHTML(static_figure_html(obj)))
    else:
        from jupyter_bokeh import BokehModel

        _ensure_live_resources()
        display(BokehModel(fit(obj)))


def state_key(controls, state: dict) -> str:
    """The key a lookup panel files a state under: what JSON.stringify makes of the values,
    in order (JavaScript writes 4e11 as 400000000000, not 400000000000.0)."""

    def js(v):
        return int(v) if isinstance(v, float) and v.is_integer() else v

    return json.dumps([js(state[c.key]) for c in controls], separators=(",", ":"))


LOOKUP_DIGITS = 7  # significant digits kept in lookup tables


def lookup_panel(  # noqa: PLR0913 - a panel's parts, keyword-only
    key: str,
    controls: tuple,
    compute: Callable[[dict], dict],
    figures,
    readout,
    budget_keys=None,
    js_sources: tuple[str, dict] | None = None,
    glue: tuple = (),
) -> Panel:
    """A panel whose every grid state kvlab computes at build time; the page only looks
    results up (`KVLAB.panels.lookup`, kvlab/viz/js/lookup.js). For small grids whose
    results are expensive (trace replays, simulations).

    `js_sources` (optional): (name, terms) of a function in KVLAB.sources that rebuilds the
    figure sources from the readout values, so that the page stores values only (much
    smaller pages)."""

    grid = [
        dict(zip([c.key for c in controls], combo, strict=True))
        for combo in itertools.product(*(c.options for c in controls))
    ]
    results = {state_key(controls, s): jsonable(compute(s), LOOKUP_DIGITS) for s in grid}
    keys = [k for k, _, _ in readout] + [k for k, _ in glue]
    if js_sources:  # values only, in readout order: the page rebuilds the sources
        table = {k: [r["values"][name] for name in keys] for k, r in results.items()}
    else:
        table = results

    def cached(state):
        k = state_key(controls, state)
        return results[k] if k in results else jsonable(compute(state))

    # The table travels as one JSON string, parsed once per page.
    terms = {
        "key": key,
        "order": [c.key for c in controls],
        "keys": keys,
        "table": json.dumps(table, separators=(",", ":")),
        "sources": js_sources[0] if js_sources else None,
        "source_terms": js_sources[1] if js_sources else None,
    }
    return Panel(key, controls, cached, figures, "lookup", terms, readout, budget_keys, glue)
