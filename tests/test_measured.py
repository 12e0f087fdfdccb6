"""The measured kernel extract, its reader, and the ledger's measured mode."""

import json
import math
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import BUDGET_KEYS  # the budget command's JSON contract

from kvlab import cost
from kvlab.cli import main
from kvlab.deployment import Deployment, KernelTables, parse_speed
from kvlab.errors import KvlabError
from kvlab.kernel_tables import devices_with_data, kernels, load
from kvlab.kernel_tables.__main__ import main as extract_main
from kvlab.kernel_tables.extract import SYSTEMS, dumps
from kvlab.kernel_tables.tables import Curve, Grid
from kvlab.ledger_rows import operator_rows

FOLDER = resources.files("kvlab").joinpath("data/kernel_tables")
DEVICES = ["a100-80gb", "b200", "h100-sxm", "h200", "l40s"]
TABLES = ("gemm", "generation_attention", "context_attention", "moe", "all_reduce")
TABLES_SPEED = KernelTables()


def measured(model="llama-3.1-8b", hardware="h100-sxm", weight_dtype="fp16", kv_dtype="fp16"):
    """A deployment timed from the kernel tables."""
    return Deployment(model, hardware, weight_dtype, kv_dtype, TABLES_SPEED)


# ------------------------------------------------------------------- the extract


def test_extract_covers_the_devices_and_stays_small():
    assert list(devices_with_data()) == DEVICES == sorted(SYSTEMS)
    total = sum(
        e.stat().st_size
        for e in (FOLDER / name for name in [f"{d}.json" for d in DEVICES] + ["NOTICE", "LICENSE"])
    )
    assert total < 1e6  # "well under 2 MB"
    notice = FOLDER.joinpath("NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and "aiconfigurator-core 0.12.0" in notice
    assert "Apache License" in FOLDER.joinpath("LICENSE").read_text()[:200]


@pytest.mark.parametrize("device", DEVICES)
def test_extract_round_trips_byte_for_byte(device):
    """Each file is exactly what the extractor's serializer writes for its content, and
    every table states its source, framework, framework version and device string."""
    text = FOLDER.joinpath(f"{device}.json").read_text()
    raw = json.loads(text)
    assert dumps(raw) + "\n" == text
    assert raw["device"] == device
    system, version = SYSTEMS[device]
    for kind in TABLES:
        table = raw[kind]
        # the rows' own version (L40S's all-reduce rows, filed under 1.3.0rc20, say 1.0.0)
        assert table["framework"] == "TRTLLM" and table["framework_version"]
        assert table["device_string"] == raw["device_string"]
        assert table["source"].startswith("aiconfigurator-core 0.12.0 (PyPI, Apache-2.0)")
        assert f"systems/data/{system}/" in table["source"]
        assert f"/trtllm/{version}/" in table["source"]


def test_extract_runs_only_with_its_extra(tmp_path, capsys):
    """Regenerating needs aiconfigurator-core; without it: one line, exit 2, nothing written."""
    pytest.importorskip("numpy")
    try:
        import aiconfigurator_core  # noqa: F401

        pytest.skip("aiconfigurator-core is installed here")
    except ImportError:
        pass
    assert extract_main(["extract", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aiconfigurator-core==0.12.0" in err
    assert not (tmp_path / "x").exists()


def test_extract_outside_a_checkout_needs_out(tmp_path, monkeypatch, capsys):
    """The default folder is the checkout's kvlab/data/kernel_tables under the current folder:
    elsewhere the command says so in one line and writes nothing (never into an installed
    package)."""
    monkeypatch.chdir(tmp_path)
    assert extract_main(["extract"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out DIR" in err and "kvlab checkout" in err
    assert list(tmp_path.iterdir()) == []


def test_the_notes_figures_hold():
    """../shared/notes/measured-data.md: bf16 GEMV (m = 1, >= 50 MB) at a median 79% of the
    sheet bandwidth on H100 SXM, 74% on A100, 76% on H200."""
    fractions = {d: load(d).raw["derived"]["gemv_fraction_of_sheet"] for d in DEVICES}
    assert fractions["h100-sxm"] == pytest.approx(0.79, abs=0.005)
    assert fractions["a100-80gb"] == pytest.approx(0.74, abs=0.005)
    assert fractions["h200"] == pytest.approx(0.76, abs=0.005)
    assert 2e-6 < load("h100-sxm").kernel_floor_s < 3e-6


# ------------------------------------------------------------------ interpolation


def test_curve_interpolates_log_log_by_hand():
    c = Curve([1, 4, 16], [2, 8, 8])
    value, ok = c(2)  # halfway in log x between 1 and 4: sqrt(2 * 8)
    assert ok and value == pytest.approx(4.0, rel=1e-12)
    assert c.scalar(2) == pytest.approx(4.0, rel=1e-12)
    assert c(8)[0] == pytest.approx(8.0) and c.scalar(16) == pytest.approx(8.0)
    value, ok = c(np.array([0.5, 1, 16, 17]))
    assert ok.tolist() == [False, True, True, False]
    assert np.isnan(value[0]) and np.isnan(value[3]) and math.isnan(c.scalar(17))


def test_grid_interpolates_and_refuses_holes():
    g = Grid([1, 4], [1, 4], [[1.0, 4.0], [4.0, np.nan]])
    assert g(1, 4)[0] == pytest.approx(4.0) and g.scalar(1, 4) == pytest.approx(4.0)
    value, ok = g(1, 2)  # along y only: sqrt(1 * 4)
    assert ok and value == pytest.approx(2.0)
    value, ok = g(2, 2)  # the (4, 4) corner is missing
    assert not ok and np.isnan(value) and math.isnan(g.scalar(2, 2))
    assert not g(8, 1)[1] and not g(1, 0.5)[1]


def test_table_points_by_hand():
    """H100, bf16: the 4096x4096 GEMM at m = 16 is the table's value; at m = 24, between the
    rows m = 17 and 32, it is their log-log interpolation. Generation attention for Llama 3.1
    8B's layout halfway (in log) between batch 16 and 32 is the geometric mean."""
    raw = load("h100-sxm").raw["gemm"]["dtypes"]["bf16"]
    ms, lat = raw["m"], raw["shapes"]["4096x4096"]["latency_us"]
    curve, how = load("h100-sxm").gemm("bf16", 4096, 4096)
    assert how == "measured"
    assert curve(16)[0] == pytest.approx(lat[ms.index(16)] * 1e-6, rel=1e-12)
    lo, hi = lat[ms.index(17)], lat[ms.index(32)]
    w = math.log(24 / 17) / math.log(32 / 17)
    assert curve(24)[0] == pytest.approx(lo ** (1 - w) * hi**w * 1e-6, rel=1e-12)
    att = load("h100-sxm").raw["generation_attention"]
    rows = att["layouts"]["32/8/128"]["bf16"]["latency_us"]
    j = att["tokens_in_cache"].index(4095)
    a, b = rows[att["batch"].index(16)][j], rows[att["batch"].index(32)][j]
    grid, _ = load("h100-sxm").attention("generation", 32, 8, 128, "bf16")
    assert grid(math.sqrt(16 * 32), 4095)[0] == pytest.approx(math.sqrt(a * b) * 1e-6, rel=1e-12)


# ------------------------------------------------------------------- measured mode


def test_measured_llama_8b_on_h100_is_a_sane_band_below_the_ceiling():
    """Llama 3.1 8B, bf16, 4K context. Slower than the ceiling, by a factor the tables
    explain: their GEMVs reach 68-80% of the sheet bandwidth at these weight sizes, decode
    attention ~75%, and ~100 small kernels at the ~2.7 us floor add ~0.27 ms. So the ceiling
    is 60-85% of the measured step, the band issue 14 found for TensorRT-LLM end to end."""
    for batch in (1, 16):
        s = cost.decode_step(measured(weight_dtype="bf16", kv_dtype="bf16"), batch, 4096)
        assert s.efficiency == "measured" and "TRTLLM 1.3.0rc20" in s.efficiency_source
        ceiling = cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), batch, 4096).step_time_s
        assert s.ceiling_step_time_s == ceiling
        assert 0.6 < s.ceiling_step_time_s / s.step_time_s < 0.85
        assert s.tokens_per_s == pytest.approx(batch / s.step_time_s)
    one = cost.decode_step(measured(), 1, 4096)
    sixteen = cost.decode_step(measured(), 16, 4096)
    assert sixteen.step_time_s > one.step_time_s and sixteen.tokens_per_s > 10 * one.tokens_per_s


def test_overhead_is_the_kernel_floor_times_the_small_kernels():
    """Llama 3.1 8B: 2 add+norm per layer and a final norm (65), SiLU x up per layer (32),
    embedding and sampling: 99 launches at the H100 table's floor."""
    s = cost.decode_step(measured(), 1, 4096)
    assert s.overhead_s == pytest.approx(99 * load("h100-sxm").kernel_floor_s, rel=1e-12)


def test_no_operator_is_faster_than_its_ceiling():
    """L40S's tables beat its sheet bandwidth below ~256 MB (the weights sit in its 96 MB L2
    while a benchmark repeats); a decode step streams every layer once, so those operators
    are held at their ceiling and say so."""
    rows = operator_rows(measured(hardware="l40s"), 1, 4096)
    assert all(r["measured_s"] >= r["ceiling_s"] * (1 - 1e-12) for r in rows)
    assert any(r["at_ceiling"] for r in rows)


@settings(max_examples=60, deadline=None)
@given(
    device=st.sampled_from(DEVICES),
    model=st.sampled_from(
        ["llama-3.1-8b", "llama-2-7b", "mistral-7b", "qwen2.5-7b", "mixtral-8x7b"]
    ),
    batch=st.integers(1, 64),
    context=st.integers(1, 32000),
)
def test_measured_is_never_below_the_ceiling(device, model, batch, context):
    """(Points beyond a table's batch x context triangle are NaN, and the fast path agrees.)"""
    s = cost.decode_step(measured(model, device, "bf16", "bf16"), np.array([batch]), context)
    fast = kernels(model, device).decode_step_s(batch, context)
    if np.isnan(s.step_time_s[0]):
        assert math.isnan(fast)
        return
    assert s.step_time_s[0] >= s.ceiling_step_time_s[0]
    assert fast == pytest.approx(s.step_time_s[0], rel=1e-9)


def test_a_batch_of_unequal_contexts_is_timed_at_its_mean():
    k = kernels("llama-3.1-8b", "h100-sxm")
    assert k.decode_contexts_s([1000, 3000, 2000, 2000]) == k.decode_step_s(4, 2000)


def test_grids_give_nan_out_of_range_and_scalars_refuse():
    d = measured()
    grid = cost.decode_step(d, np.array([1, 16, 4096]), 4096)
    assert np.isfinite(grid.step_time_s[:2]).all() and np.isnan(grid.step_time_s[2])
    contexts = np.array([100, 1000, 200_000])
    row = cost.decode_step(d, 8, contexts)
    assert np.isfinite(row.step_time_s[:2]).all() and np.isnan(row.step_time_s[2])
    point = cost.decode_step(d, 8, 1000)
    assert row.step_time_s[1] == pytest.approx(point.step_time_s, rel=1e-12)
    with pytest.raises(KvlabError, match="outside the measured kernel tables.*attention"):
        cost.decode_step(d, 4096, 4096)
    with pytest.raises(KvlabError, match="outside"):
        cost.decode_step(d, 1, 200_000)
    assert math.isnan(kernels("llama-3.1-8b", "h100-sxm").decode_step_s(1, 200_000))
    with pytest.raises(KvlabError, match="m \\(tokens\\) 1 to 8192"):
        cost.prefill(measured(hardware="a100-80gb"), 16384)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(hardware="rtx-4090"), "devices with data: a100-80gb, b200, h100-sxm, h200, l40s"),
        (dict(model="deepseek-v3"), "MLA"),
        (dict(weight_dtype="int4"), "no measured GEMMs for int4 on h100-sxm .* have bf16, fp8"),
        (dict(hardware="a100-80gb", kv_dtype="fp8"), "KV for fp8 on a100-80gb"),
        (dict(weight_dtype="fp32"), "no measured GEMMs for fp32"),
        (dict(bandwidth_bytes_per_s=2e12), "bandwidth override does not apply"),
        (dict(speed="measureD "), None),
        (dict(speed="fast"), "efficiency must be a number in \\(0, 1\\] or 'measured'"),
    ],
)
def test_measured_mode_refuses_what_it_has_no_tables_for(kwargs, message):
    """Whether it refuses when the deployment is made (an override, a word it does not know)
    or when the step is timed (no tables for this device, model or dtype)."""
    args = dict(model="llama-3.1-8b", hardware="h100-sxm", speed="measured")
    args.update(kwargs)

    def step():
        speed = parse_speed(args.pop("speed"))  # what the command line and the panels do
        return cost.decode_step(Deployment(speed=speed, **args), 4, 1024)

    if message is None:
        assert step().efficiency == "measured"
        return
    with pytest.raises(KvlabError, match=message):
        step()


def test_int4_on_a100_is_measured_and_quantization_still_pays():
    """A100's TensorRT-LLM 1.0 tables have weight-only int8/int4 GEMMs: small int4 GEMVs
    are far from the bandwidth (latency-bound), so int4 buys ~2x at batch 1, not 4x."""
    bf16 = cost.decode_step(measured(hardware="a100-80gb", weight_dtype="bf16"), 1, 1024)
    int4 = cost.decode_step(measured(hardware="a100-80gb", weight_dtype="int4"), 1, 1024)
    assert 1.5 < bf16.step_time_s / int4.step_time_s < 3.5
    assert int4.ceiling_step_time_s / int4.step_time_s < bf16.ceiling_step_time_s / bf16.step_time_s


def test_measured_prefill_keeps_flash_attention_and_prefix_hits_save():
    d = measured()
    full = cost.prefill(d, 8192)
    half = cost.prefill(d, 8192, 4096)
    done = cost.prefill(d, 8192, 8192)
    # a whole-prompt hit still computes the last token
    assert full.time_s > half.time_s > done.time_s > 0
    assert done.cached_tokens == 8191
    assert 0.5 < full.ceiling_time_s / full.time_s < 0.9
    with pytest.raises(KvlabError, match="flash_attention=False"):
        cost.prefill(d, 8192, flash_attention=False)


def test_tensor_parallel_adds_all_reduces_and_splits_the_weights():
    one = kernels("llama-3.1-70b", "h100-sxm", tp=1)
    two = kernels("llama-3.1-70b", "h100-sxm", tp=2)
    s1, s2 = one.decode(8, 4096), two.decode(8, 4096)
    names = {op.name for op in s2.operators}
    assert "all_reduce" in names and "all_reduce" not in {op.name for op in s1.operators}
    reduce = next(op for op in s2.operators if op.name == "all_reduce")
    assert reduce.calls == 160 and float(reduce.measured_s) > 0
    assert float(s1.step_time_s) / 2 < float(s2.step_time_s) < float(s1.step_time_s)


# ------------------------------------------------------------------------- CLI


def test_budget_measured_json_keeps_the_contract(capsys):
    code = main(
        [
            "budget",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "16",
            "--context",
            "4k",
            "--efficiency",
            "measured",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    r = json.loads(out)
    assert BUDGET_KEYS | {"ttft_s", "ceiling_step_time_s", "efficiency_source"} <= set(r)
    assert r["step_time_s"] > r["ceiling_step_time_s"]
    total = sum(op["measured_s"] for op in r["operators"])
    assert total == pytest.approx(r["step_time_s"], rel=1e-9)
    assert "TRTLLM 1.3.0rc20" in r["efficiency_source"]


def test_budget_measured_on_a_device_without_data_exits_2(capsys):
    code = main(
        ["budget", "--model", "llama-3.1-8b", "--hardware", "l4", "--efficiency", "measured"]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "devices with data: a100-80gb, b200, h100-sxm, h200, l40s" in err


def test_budget_measured_says_when_the_prompt_is_beyond_the_prefill_tables(capsys):
    code = main(
        [
            "budget",
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "a100-80gb",
            "--context",
            "16k",
            "--efficiency",
            "measured",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0 and "not measured" in out and "note: TTFT not measured" in out
