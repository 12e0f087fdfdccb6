"""kvlab's browser code under node: every static panel's JavaScript twin returns what its
Python `compute` returns, state by state (sources and values, to 1e-9 relative; strings
equal; null where Python has None or a non-finite number), and the library's twins in
kvlab.js (ledger, memory fit, knee, served tokens, formats) are kvlab's Python.

Each panel's states go to node in one batch (tests/js_harness.js, JSON in and out). A
panel's states are its whole grid (every combination of every control's options) when that
grid has at most FULL_GRID_MAX states; the ledger panels' larger grids (up to 2.4 million
states, hours of Python) are covered by a covering array in which any three controls take
every combination of their options at least once. KVLAB_JS_FULL_GRID=1 runs every grid
whole, in batches of CHUNK_STATES states.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kvlab.models as registry
from kvlab import cost, fmt
from kvlab.book.catalog import panels
from kvlab.deployment import Ceiling, Deployment
from kvlab.grids import BATCH_GRID, CONTEXT_GRID, DTYPE_CHOICES
from kvlab.hardware import devices
from kvlab.jsonsafe import jsonable
from kvlab.models import get_model, models
from kvlab.prompt import served_tokens
from kvlab.viz import speed
from kvlab.viz.panel import FORMATS, kvlab_js
from kvlab.viz.terms import DTYPES, ledger_terms

NODE = shutil.which("node")
HARNESS = Path(__file__).with_name("js_harness.js")
pytestmark = pytest.mark.skipif(
    NODE is None,
    reason="node (Node.js 20) is not installed, so kvlab's browser code cannot "
    "run here: install it (apt-get install nodejs) to check the panels",
)
REL_TOL = 1e-9
FULL_GRID_MAX = 4000  # states; larger grids: strength-3 covering arrays (module docstring)
CHUNK_STATES = 20_000  # states per node run when whole large grids are asked for
COVER_STRENGTH = 3
WINDOWED = "mistral-7b-window"  # Mistral 7B (v0.3) with v0.1's 4,096-token sliding window


# ------------------------------------------------------------------ plumbing
@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """The one script the book ships (kvlab.js and every panel's file)."""
    path = tmp_path_factory.mktemp("js") / "kvlab-bundle.js"
    path.write_text(kvlab_js())
    return path


def run_node(library: Path, jobs: list) -> list:
    """One node run of tests/js_harness.js over `jobs`; one list of results per job."""
    out = subprocess.run(
        [NODE, str(HARNESS), str(library)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def differences(want, got, path: str = "") -> list[str]:
    """Where `got` (from node) differs from `want` (jsonable Python). A result whose JSON is
    `want`'s exactly (most are) differs nowhere: that is checked first, in C, for the whole
    result (JSON keeps true apart from 1 and null apart from 0, as the walk below does)."""
    if not path and (same := _canonical(want)) is not None and same == _canonical(got):
        return []
    threw = isinstance(got, dict) and "error" in got
    if threw and not (isinstance(want, dict) and "error" in want):
        return [f"{path}: JavaScript threw {got['error'].splitlines()[0]}"]
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(want) != set(got):
            shown = sorted(got) if isinstance(got, dict) else got
            return [f"{path}: keys {sorted(want)} != {shown}"]
        return [d for k in want for d in differences(want[k], got[k], f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(want) != len(got):
            return [f"{path}: {want!r} != {got!r}"]
        return [
            d
            for i, (w, g) in enumerate(zip(want, got, strict=True))
            for d in differences(w, g, f"{path}[{i}]")
        ]
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return [] if (type(got) is type(want) and got == want) else [f"{path}: {want!r} != {got!r}"]
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return [f"{path}: {want!r} != {got!r}"]
    same = math.isclose(want, got, rel_tol=REL_TOL, abs_tol=0.0)
    return [] if same else [f"{path}: {want!r} != {got!r}"]


def _canonical(value) -> str | None:
    """`value` as JSON with sorted keys; None if it is not JSON (NaN, numpy values)."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None


def covering_rows(sizes: list[int], strength: int = COVER_STRENGTH) -> list[list[int]]:
    """Rows of option indices in which any `strength` controls show every combination of
    their options at least once (a covering array, built greedily; deterministic)."""
    k = len(sizes)
    if k <= strength:
        return [list(r) for r in itertools.product(*(range(n) for n in sizes))]
    groups = list(itertools.combinations(range(k), strength))
    with_control = [[g for g in groups if c in g] for c in range(k)]  # the groups c is in
    wanted = [(g, v) for g in groups for v in itertools.product(*(range(sizes[c]) for c in g))]
    uncovered, seed = set(wanted), 0
    order = sorted(range(k), key=lambda c: -sizes[c])
    rows = []
    while uncovered:
        while wanted[seed] not in uncovered:
            seed += 1
        row = [None] * k
        for c, v in zip(*wanted[seed], strict=True):
            row[c] = v
        for c in (c for c in order if row[c] is None):
            row[c] = max(
                range(sizes[c]),
                key=lambda v, c=c: (_newly_covered(row, c, v, with_control[c], uncovered), -v),
            )
        uncovered.difference_update((g, tuple(row[x] for x in g)) for g in groups)
        rows.append(row)
    return rows


def _newly_covered(row, c, v, groups, uncovered) -> int:
    """How many still uncovered combinations setting control c to v in `row` covers
    (`groups`: those that contain c)."""
    trial = row[:c] + [v] + row[c + 1 :]
    return sum(
        (g, tuple(trial[x] for x in g)) in uncovered
        for g in groups
        if all(trial[x] is not None for x in g)
    )


def grid_states(panel) -> list[dict]:
    """The panel's whole grid, or (large grids) its covering array plus the default state."""
    keys = [c.key for c in panel.controls]
    options = [c.options for c in panel.controls]
    whole = os.environ.get("KVLAB_JS_FULL_GRID") == "1"
    if whole or math.prod(len(o) for o in options) <= FULL_GRID_MAX:
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]
    rows = covering_rows([len(o) for o in options])
    states = [{k: o[i] for k, o, i in zip(keys, options, row, strict=True)} for row in rows]
    return [panel.default_state] + [s for s in states if s != panel.default_state]


@functools.lru_cache(maxsize=None)
def built_panel(key: str):
    return panels()[key]()


def check_panel(panel, states: list[dict], library: Path, computed: list | None = None) -> None:
    """Every state's JavaScript result equals the panel's Python compute (`computed`: what
    panel.compute returned for each state, when the caller has it already)."""
    bad = []
    for start in range(0, len(states), CHUNK_STATES):
        chunk = states[start : start + CHUNK_STATES]
        got = run_node(library, [{"panel": panel.js, "terms": panel.terms, "states": chunk}])[0]
        for i, (state, result) in enumerate(zip(chunk, got, strict=True), start):
            want = computed[i] if computed is not None else panel.compute(state)
            found = differences(jsonable(want), result)
            bad += [f"{state}: {d}" for d in found[:3]]
            if len(bad) >= 12:
                break
    assert not bad, f"{panel.key}: JavaScript differs from Python:\n" + "\n".join(bad)


# ------------------------------------------------------------------ panels
@pytest.mark.parametrize("key", sorted(panels()))
def test_panel_javascript_is_its_python_compute_on_the_grid(key, library):
    panel = built_panel(key)
    assert panel.js, f"{key} has no JavaScript twin"
    check_panel(panel, grid_states(panel), library)


def test_covering_arrays_cover_every_three_controls():
    sizes = [8, 8, 17, 10, 5, 5, 9]  # the ledger panel's grid
    rows = covering_rows(sizes)
    for group in itertools.combinations(range(len(sizes)), 3):
        seen = {tuple(r[c] for c in group) for r in rows}
        assert len(seen) == math.prod(sizes[c] for c in group)
    assert len(rows) < 1.2 * 17 * 10 * 9  # near the bound: the three largest grids' product


# ------------------------------------------------------- the measured mode
#: (batch, context) points of the measured states: inside the kernel tables' range, at its
#: edges, and outside it (a large batch at a long context).
MEASURED_POINTS = ((1, 256), (24, 4096), (8, 65536), (192, 16384), (384, 2048), (1024, 131072))


def measured_states(panel) -> list[dict]:
    """The decode-step panel in measured mode: every model x device x dtype pair of the
    grid the kernel tables cover, at MEASURED_POINTS, and one state for each kind of
    configuration they do not cover (no tables for the device, MLA, each weight or KV dtype)."""

    covered, uncovered = [], {}
    for m, d, w, k in itertools.product(models(), devices(), DTYPE_CHOICES, DTYPE_CHOICES):
        base = {
            **panel.default_state,
            "model": m,
            "hardware": d,
            "weight_dtype": w,
            "kv_dtype": k,
            "efficiency": 0.8,
            "speed": "measured",
        }
        why = speed.why_not(m, d, w, k)
        if why:
            uncovered.setdefault(why, base)  # one state per phrase
        else:
            covered += [{**base, "batch": b, "context": c} for b, c in MEASURED_POINTS]
    return covered + list(uncovered.values())


def test_decode_step_panel_in_measured_mode(library):
    """The ledger panel's JavaScript against Python in measured mode, for every covered
    configuration (out of the tables' range too) and every kind of uncovered one."""
    panel = built_panel("ledger")
    states = measured_states(panel)
    computed = [panel.compute(s) for s in states]
    values = [c["values"] for c in computed]
    timed = sum(v["efficiency"] == "measured" for v in values)
    assert timed > 500 and len(states) - timed > 500  # both kinds, many of each
    assert {v["speed"].split(": ")[-1] for v in values} >= {
        "no kernel tables for this device",
        "no MLA attention tables",
        "no int4 weight tables",
        "no fp8 KV tables",
        "outside the tables' range",
        "TRTLLM 1.3.0rc20 kernels",
        "TRTLLM 1.0.0 kernels",
    }
    check_panel(panel, states, library, computed)


# ------------------------------------------------------- sliding windows
@pytest.fixture
def windowed_catalogue(monkeypatch):
    """The catalogue plus Mistral 7B with Mistral 7B v0.1's 4,096-token sliding window (the
    catalogued v0.3 has none; no catalogued model has one)."""

    spec = dataclasses.replace(
        get_model("mistral-7b"),
        name=WINDOWED,
        sliding_window=4096,
        display_name="Mistral 7B, 4K sliding window",
    )
    extended = {**registry._catalogue(), WINDOWED: spec}
    monkeypatch.setattr(registry, "_catalogue", lambda: extended)
    return spec


def test_footprint_longest_context_counts_a_sliding_window(windowed_catalogue, library):
    from kvlab.viz.beyond_hbm import footprint_panel  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    panel = footprint_panel()
    assert WINDOWED in panel.controls[0].options
    here = {"model": WINDOWED, "hardware": "h100-sxm"}
    assert panel.values(**here, batch=32)["max_context"] == math.inf  # 32 windows fit: any context
    assert panel.readout_texts(**here, batch=32)["footprint_max_context"] == "unbounded"
    assert math.isfinite(panel.values(**here, batch=1024)["max_context"])  # 1024 windows do not
    states = [{"model": WINDOWED, "hardware": d, "batch": b} for d in devices() for b in BATCH_GRID]
    check_panel(panel, states, library)


# ------------------------------------------------------ the library's twins
STEP_POINTS = {
    "batch": np.array([1, 64, 1024]),
    "context": np.array([256, 8192, 131072]),
    "efficiency": np.array([1.0, 0.75, 0.5]),
}
PREFILL_POINTS = {
    "prompt_tokens": np.array([8192, 8192, 4097]),
    "cached_tokens": np.array([0, 7372, 0]),
    "batch": np.array([1, 4, 1]),
    "efficiency": np.array([1.0, 0.8, 0.6]),
}


def _catalogue_combos():
    return itertools.product(models(), devices(), DTYPES, DTYPES)


def _rows(result, n: int) -> list[dict]:
    """A vectorised ledger result as one dict per point."""
    d = result.to_dict()
    return [
        jsonable({k: (v[i] if isinstance(v, list) else v) for k, v in d.items()}) for i in range(n)
    ]


def _ledger_cases() -> dict[str, list[tuple[dict, dict]]]:
    """{twin: [(state, Python's result)]} over the catalogue, three points each."""
    cases = {"step": [], "memoryFit": [], "prefill": [], "prefill-naive": []}
    batch, context = STEP_POINTS["batch"], STEP_POINTS["context"]
    for m, d, w, k in _catalogue_combos():
        names = {"model": m, "hardware": d, "weight_dtype": w, "kv_dtype": k}
        step_at = Deployment(m, d, w, k, Ceiling(STEP_POINTS["efficiency"]))
        fill_at = Deployment(m, d, w, k, Ceiling(PREFILL_POINTS["efficiency"]))
        fill = [PREFILL_POINTS[key] for key in ("prompt_tokens", "cached_tokens", "batch")]
        want = {
            "step": _rows(cost.decode_step(step_at, batch, context), 3),
            "memoryFit": _rows(cost.memory_fit(Deployment(m, d, w, k), batch, context), 3),
            "prefill": _rows(cost.prefill(fill_at, *fill), 3),
            "prefill-naive": _rows(cost.prefill(fill_at, *fill, flash_attention=False), 3),
        }
        for i in range(3):
            step = {**names, **{key: v[i].item() for key, v in STEP_POINTS.items()}}
            fill = {**names, **{key: v[i].item() for key, v in PREFILL_POINTS.items()}}
            for name, state in (
                ("step", step),
                ("memoryFit", step),
                ("prefill", fill),
                ("prefill-naive", {**fill, "flash_attention": False}),
            ):
                cases[name].append((state, want[name][i]))
    return cases


def test_ledger_twin_is_kvlab_cost_on_every_catalogue_state(windowed_catalogue, library):
    """KVLAB.step, prefill (flash and naive attention) and memoryFit against kvlab.cost for
    every model (and a windowed one) x device x weight dtype x KV dtype, at three points:
    7,776 states each."""
    cases = _ledger_cases()
    assert len(cases["step"]) == len(models()) * len(devices()) * len(DTYPES) ** 2 * 3
    terms = ledger_terms(models(), devices())
    jobs = [
        {"library": name.split("-")[0], "terms": terms, "args": [[s] for s, _ in rows]}
        for name, rows in cases.items()
    ]
    bad = []
    for (name, rows), got in zip(cases.items(), run_node(library, jobs), strict=True):
        for (state, want), result in zip(rows, got, strict=True):
            bad += [f"{name} {state}: {d}" for d in differences(want, result)[:2]]
    assert not bad, "\n".join(bad[:12])


def _knee_input(kv, weights, bound) -> list[dict]:
    return [
        {"kv_read_bytes": float(a), "weight_read_bytes": float(b), "bound": str(c)}
        for a, b, c in zip(kv, weights, bound, strict=True)
    ]


def test_knee_twin_is_kvlab_cost_batch_knee(library):
    """KVLAB.batchKnee on Python's own steps gives cost.batch_knee's index for every model,
    device, dtype pair and context of the grid, and at the rule's edges."""
    batches, contexts = np.array(BATCH_GRID)[:, None], np.array(CONTEXT_GRID)[None, :]
    columns = []
    for m, d, w, k in _catalogue_combos():
        s = cost.decode_step(Deployment(m, d, w, k), batches, contexts)  # (batch, context)
        kv = np.asarray(s.kv_read_bytes)
        weights = np.broadcast_to(s.weight_read_bytes, kv.shape)
        bound = np.broadcast_to(s.bound, kv.shape)
        columns += [(kv[:, j], weights[:, j], bound[:, j]) for j in range(kv.shape[1])]
    columns += [
        ([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], ["memory"] * 3),  # KV reads equal the weights
        ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], ["memory", "compute", "memory"]),  # compute
        ([1.0, 1.0], [2.0, 2.0], ["memory", "memory"]),  # neither: the last batch
    ]
    want = [
        cost.batch_knee(
            SimpleNamespace(
                kv_read_bytes=np.asarray(kv),
                bound=np.asarray(bound),
                weight_read_bytes=np.asarray(weights),
            )
        )
        for kv, weights, bound in columns
    ]
    args = [[_knee_input(*column)] for column in columns]
    got = run_node(library, [{"library": "batchKnee", "terms": None, "args": args}])[0]
    assert got == want
    assert want[-3:] == [1, 1, 1] and len(set(want)) > 3  # the knee moves across the grid


def test_served_tokens_twin_is_kvlab_prompt(library):
    """KVLAB.servedTokens is kvlab.prompt.served_tokens: never the prompt's last token."""
    args = [
        [hit, prompt]
        for prompt in (1, 2, 7, 4096, 8192)
        for hit in sorted(
            {0, 1, prompt - 1, prompt, prompt + 5, math.floor(0.95 * prompt), 3 * prompt}
        )
    ]
    got = run_node(library, [{"library": "servedTokens", "terms": None, "args": args}])[0]
    assert got == [served_tokens(hit, prompt) for hit, prompt in args]


def test_readout_formats_are_twins(library):
    """Every readout kind formats a value as kvlab.viz.panel.FORMATS does."""
    rng = np.random.default_rng(12)
    numbers = np.concatenate(
        [10 ** rng.uniform(-9, 16, 60), [0.0, 1.0, 2.5, 999.95, 1e21, 0.125, 0.95]]
    ).tolist()
    samples = {
        "yesno": [True, False],
        "text": ["memory", "compute", "Llama 3.1 8B"],
        "ratio": numbers + [None],
        "count_or_never": [None, 0.0, 12.0, 4096.0],
        "count_or_unbounded": [None, 0.0, 15735.0],
    }
    jobs = [
        {
            "library": f"FORMATS.{kind}",
            "terms": None,
            "args": [[v] for v in samples.get(kind, numbers)],
        }
        for kind in FORMATS
    ]
    *got, js_kinds = run_node(library, [*jobs, {"keys": "FORMATS"}])
    assert sorted(js_kinds) == sorted(FORMATS)
    for kind, texts in zip(FORMATS, got, strict=True):
        assert texts == [FORMATS[kind](v) for v in samples.get(kind, numbers)], kind


#: Shares just short of all (and all): a readout must never round them up to 100%.
NEAR_ALL = [12_030 / 12_031, 0.9995, 0.99995, 1 - 1e-7, 1 - 1e-12, 1.0, 0.5]


def test_formatting_matches_kvlab_fmt_digit_for_digit(library):
    """kvlab.js formats numbers as kvlab.fmt does (readouts and the prose depend on it)."""
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            10 ** rng.uniform(-10, 16, 400),
            -(10 ** rng.uniform(-3, 6, 50)),
            [0.0, 1.0, 999.5, 999.95, 1000.0, 0.125, 2.5, 1.125e9, 9.995e-4, 1e21],
        ]
    ).tolist()
    # name -> (kvlab.js function, the values, its arguments, kvlab.fmt's text of a value)
    calls = {
        "si": ("si", values, lambda v: [v, "B"], lambda v: fmt.si(v, "B")),
        "seconds": ("seconds", values, lambda v: [abs(v)], lambda v: fmt.seconds(abs(v))),
        "rate": ("rate", values, lambda v: [v], fmt.rate),
        "sig": ("sig", values, lambda v: [v, 3], lambda v: fmt.sig(v, 3)),
        "percent": ("percent", values, lambda v: [v / 1e9], lambda v: fmt.percent(v / 1e9)),
        "percent near all": ("percent", NEAR_ALL, lambda v: [v], fmt.percent),
    }
    jobs = [
        {"library": fn, "terms": None, "args": [args(v) for v in xs]}
        for fn, xs, args, _ in calls.values()
    ]
    for (name, (_, xs, _args, python)), texts in zip(
        calls.items(), run_node(library, jobs), strict=True
    ):
        mismatches = [(v, g, python(v)) for v, g in zip(xs, texts, strict=True) if g != python(v)]
        assert mismatches == [], name
