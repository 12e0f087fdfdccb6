"""Figures and panels on the Python side: every panel computes, renders statically, and
its values agree with the ledger; formatting rules that the browser mirrors."""
import itertools
import json

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
