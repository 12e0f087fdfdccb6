"""The Chinese edition's labels: one table keyed by the English label, applied only when
the book is built in Chinese (KVLAB_BOOK_LANG=zh_CN).

Why one table and not a gettext call at each label: labels live in bokeh models and in
data that the static page's JavaScript rebuilds on every slider move, so the browser
needs the same table (`browser_js`); the catalogue, read once into a dict, serves Python
and JavaScript alike. Values never change, only the
words: a readout's data-value stays the English/number value Python computed.

- `t(text)`: the label in the edition's language (unchanged in English);
- `localize(layout)`: every visible text of a bokeh layout (titles, axis labels, legends,
  hover labels, categorical factors, text columns of its data, widget titles and options);
- `browser_js()`: the table for the static page, which wraps KVLAB.FORMATS and KVLAB.apply
  so that readouts and rebuilt data are translated the same way after a change;
- `missing(texts)`, `visible_texts(layout)`: what tests/test_i18n.py checks.

The table is a gettext catalogue, `kvlab/viz/locale/zh_CN/LC_MESSAGES/kvlab-labels.po`
(inside the package so it ships with it; apart from the pages' catalogues in locale/,
which `make locale` regenerates and Sphinx compiles), read once through `gettext` (`labels`) into
ZH (exact labels), PATTERNS (msgctxt "pattern": templates with `{name}` slots, each
slot translated in turn, first match first) and KEEP (msgctxt "keep": names that stay
as they are). Names of products, models, dtypes and catalogue ids stay too (`exempt`).
"""

from __future__ import annotations

import json
import os
import re
from functools import cache, lru_cache
from pathlib import Path

from .. import hardware, models
from . import po

LANG_ENV = "KVLAB_BOOK_LANG"
CHINESE = "zh_CN"
#: The Chinese labels (see the module's docstring).
CATALOGUE = Path(__file__).parent / "locale" / CHINESE / "LC_MESSAGES" / "kvlab-labels.po"

#: Data columns that are never shown as text (colours, markers).
HIDDEN_COLUMNS = frozenset(
    {"color", "colour", "marker", "line_dash", "fill_color", "line_color", "hatch_pattern"}
)


@cache
def labels() -> tuple[frozenset[str], dict[str, str], list[tuple[str, str]]]:
    """(KEEP, ZH, PATTERNS) from the catalogue, in its order."""
    entries, translations = po.load(CATALOGUE)
    contexts = {entry.context for entry in entries} - {None, "keep", "pattern"}
    if contexts:
        raise ValueError(f"{CATALOGUE}: unknown msgctxt {sorted(contexts)}")
    of = lambda context: [e.msgid for e in entries if e.context == context]  # noqa: E731
    keep = frozenset(translations.pgettext("keep", msgid) for msgid in of("keep"))
    table = {msgid: translations.gettext(msgid) for msgid in of(None)}
    patterns = [(msgid, translations.pgettext("pattern", msgid)) for msgid in of("pattern")]
    return keep, table, patterns


KEEP, ZH, PATTERNS = labels()


def language() -> str:
    """'zh_CN' when the book (or a kernel) runs for the Chinese edition, else 'en'."""
    return CHINESE if os.environ.get(LANG_ENV, "").replace("-", "_") == CHINESE else "en"


def chinese() -> bool:
    return language() == CHINESE


@lru_cache(maxsize=1)
def _table() -> tuple[dict, list]:
    compiled = []
    for english, chinese_text in PATTERNS:
        names = re.findall(r"\{(\w+)\}", english)
        literal = re.split(r"\{\w+\}", english)
        source = "^" + "(.+?)".join(re.escape(part) for part in literal) + "$"
        compiled.append((re.compile(source), names, chinese_text, english))
    return ZH, compiled


_NUMERIC = re.compile(
    r"^[\s\d.,:;%×x+\-–—/()\[\]~≈<>=·#±]*"
    r"(?:[kMGTP]?(?:B|B/s|b/s|FLOP|FLOP/s|FLOP/B|s|ms|µs|ns|Hz|GbE|G|K)?[\s\d.,%×x+\-–/()\[\]]*)*$"
)
_IDENTIFIER = re.compile(r"^[a-z0-9][a-z0-9.+_]*(?:[-_][a-z0-9.+]+)+$|^[a-z]*\d[a-z0-9.]*$")


@lru_cache(maxsize=1)
def _names() -> frozenset:
    """Proper names that stay in every language: catalogue display names and ids."""
    names = set(KEEP)
    for name, device in hardware.devices().items():
        names.update({name, device.display_name})
    for name, model in models.models().items():
        names.update({name, model.display_name})
    names.update(hardware.tiers())
    return frozenset(names)


def _name_token(token: str) -> bool:
    """'NVIDIA', 'A100-SXM4-80GB', '1.3.0rc20', 'x16': part of a product name, not a word."""
    return not (re.fullmatch(r"[a-z]+|[A-Z][a-z]+", token) or re.search(r"[a-z]{3,}", token))


def exempt(text: str) -> bool:
    """Text that stays as it is: numbers with units, catalogue names, ids, product names."""
    text = text.strip()
    return (
        not text
        or not re.search(r"[A-Za-z]", text)
        or bool(_NUMERIC.match(text))
        or text in _names()
        or bool(_IDENTIFIER.match(text))
        or text.startswith(("@", "#"))
        or all(_name_token(token) for token in text.split())
    )


def zh(text: str) -> str | None:
    """The Chinese for `text`, or None when neither the table nor a template knows it (and
    it is not exempt)."""
    table, patterns = _table()
    if text in table:
        return table[text]
    for regex, names, chinese_text, _english in patterns:
        match = regex.match(text)
        if match:
            parts = [zh(part) for part in match.groups()]
            if all(p is not None for p in parts):
                return chinese_text.format(**dict(zip(names, parts, strict=True)))
    return text if exempt(text) else None


def t(text):
    """`text` in the edition's language (anything not a string passes through)."""
    if not isinstance(text, str) or not chinese():
        return text
    found = zh(text)
    return text if found is None else found


def missing(texts) -> list[str]:
    """The texts that have no Chinese entry (and are not exempt), sorted."""
    return sorted({text for text in texts if isinstance(text, str) and zh(text) is None})


# ------------------------------------------------------------------ bokeh layouts
def _strings(column):
    """A data column's text cells, or None when it holds no text."""
    values = list(column) if hasattr(column, "__len__") and not isinstance(column, str) else []
    return values if values and all(isinstance(v, str) for v in values) else None


def rewrite(layout, fn) -> None:
    """Apply `fn` to every visible text of a bokeh layout, in place."""
    from bokeh.core.property.vectorization import Value
    from bokeh.models import (
        Axis,
        ColumnDataSource,
        FactorRange,
        HoverTool,
        Label,
        Legend,
        Select,
        Slider,
        TabPanel,
        Title,
    )

    for model in layout.references():
        if isinstance(model, Title) and model.text:
            model.text = fn(model.text)
        elif isinstance(model, Label) and model.text:
            model.text = fn(model.text)
        elif isinstance(model, TabPanel) and model.title:
            model.title = fn(model.title)
        elif isinstance(model, Axis) and isinstance(model.axis_label, str):
            model.axis_label = fn(model.axis_label)
        elif isinstance(model, Legend):
            if isinstance(model.title, str):
                model.title = fn(model.title)
            for item in model.items:
                if isinstance(item.label, Value) and isinstance(item.label.value, str):
                    item.label = Value(fn(item.label.value))
        elif isinstance(model, HoverTool) and isinstance(model.tooltips, list):
            model.tooltips = [(fn(label), fn(template)) for label, template in model.tooltips]
        elif isinstance(model, FactorRange):
            model.factors = [
                fn(f) if isinstance(f, str) else tuple(fn(x) for x in f) for f in model.factors
            ]
        elif isinstance(model, ColumnDataSource):
            model.data = {
                name: (
                    [fn(v) for v in col] if name not in HIDDEN_COLUMNS and _strings(col) else col
                )
                for name, col in model.data.items()
            }
        elif isinstance(model, (Slider, Select)):
            model.title = fn(model.title)
            if isinstance(model, Select):  # options: values, or (value, label)
                model.options = [
                    (o[0], fn(o[1])) if isinstance(o, tuple) else o for o in model.options
                ]


def localize(layout):
    """The layout with its visible texts in the edition's language (in place; returned)."""
    if chinese():
        rewrite(layout, t)
    return layout


def visible_texts(layout) -> set[str]:
    """Every visible text of a layout (tests)."""
    seen: set[str] = set()

    def note(text):
        if isinstance(text, str):
            seen.add(text)
        return text

    rewrite(layout, note)
    return seen


# ------------------------------------------------------------------ the browser
_BROWSER = """(function () {
  "use strict";
  const K = window.KVLAB, ZH = %s, PATTERNS = %s, HIDDEN = new Set(%s);
  const [NUMERIC, IDENTIFIER, NAMES] = [new RegExp(%s), new RegExp(%s), new Set(%s)];
  const compiled = PATTERNS.map(([source, names, zh]) => [new RegExp(source), names, zh]);
  function exempt(text) {  // i18n.exempt
    const s = text.trim();
    return !s || !/[A-Za-z]/.test(s) || NUMERIC.test(s) || NAMES.has(s) || IDENTIFIER.test(s) ||
      s.startsWith("@") || s.startsWith("#") ||
      s.split(/\\s+/).every((w) => !/^(?:[a-z]+|[A-Z][a-z]+)$/.test(w) && !/[a-z]{3,}/.test(w));
  }
  function zh(text) {  // i18n.zh: a template counts only when each of its slots translates
    if (Object.prototype.hasOwnProperty.call(ZH, text)) return ZH[text];
    for (const [regex, names, out] of compiled) {
      const m = regex.exec(text), parts = m ? m.slice(1).map(zh) : [null];
      if (parts.every((p) => p !== null)) {
        return names.reduce((o, name, i) => o.split("{" + name + "}").join(parts[i]), out);
      }
    }
    return exempt(text) ? text : null;
  }
  function tr(text) {
    if (typeof text !== "string") return text;
    const found = zh(text);
    return found === null ? text : found;
  }
  for (const kind of Object.keys(K.FORMATS)) {
    const format = K.FORMATS[kind];
    K.FORMATS[kind] = (v) => tr(format(v));
  }
  const apply = K.apply;
  K.apply = function (result, sources, readout, spec, titles) {
    const translated = {};
    for (const [name, data] of Object.entries(result.sources || {})) {
      translated[name] = {};
      for (const [column, values] of Object.entries(data)) {
        const text = Array.isArray(values) && values.length &&
          values.every((v) => typeof v === "string");
        translated[name][column] = (text && !HIDDEN.has(column)) ? values.map(tr) : values;
      }
    }
    const labels = (spec || []).map(([key, label, kind]) => [key, tr(label), kind]);
    const named = Object.fromEntries(
      Object.entries(result.titles || {}).map(([k, v]) => [k, tr(v)]));
    return apply(Object.assign({}, result, {sources: translated, titles: named}), sources, readout,
                 labels, titles);
  };
  K.tr = tr;
})();
"""


def browser_js() -> str:
    """The table and the wrappers for the Chinese site ('' in English): loaded after kvlab.js."""
    if not chinese():
        return ""
    table, patterns = _table()
    js_patterns = [
        [regex.pattern, names, chinese_text] for regex, names, chinese_text, _english in patterns
    ]
    dump = lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    return _BROWSER % (
        dump(table),
        dump(js_patterns),
        dump(sorted(HIDDEN_COLUMNS)),
        dump(_NUMERIC.pattern),
        dump(_IDENTIFIER.pattern),
        dump(sorted(_names())),
    )
