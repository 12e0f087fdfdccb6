"""The `kvlab` command line: the JSON contract, readable tables, bad input -> exit 2."""
import json
import subprocess
import sys

import pytest

from kvlab.cli import main

BUDGET_KEYS = {"weight_bytes", "kv_bytes_per_token", "kv_read_bytes", "step_bytes", "step_time_s",
               "tokens_per_s", "tokens_per_s_per_sequence", "kv_cache_bytes", "fits", "max_batch",
               "bound", "arithmetic_intensity"}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_budget_reproduces_the_article(capsys):
    code, out, err = run(capsys, "budget", "--model", "article-7b", "--bandwidth", "2e12",
                         "--batch", "1", "--context", "4096", "--json")
    assert code == 0 and err == ""
    r = json.loads(out)
    assert BUDGET_KEYS <= set(r)
    assert r["weight_bytes"] == 14e9
    assert r["kv_bytes_per_token"] == 131072
    assert r["kv_read_bytes"] == 536870912
    assert round(r["tokens_per_s"], 1) == 137.6
    assert r["bound"] == "memory" and r["fits"] is True


def test_budget_table_is_readable(capsys):
    code, out, _ = run(capsys, "budget", "--model", "llama-3.1-8b", "--hardware", "l4", "--batch", "32",
                       "--context", "8k")
    assert code == 0
    assert "weights read" in out and "KV history read" in out and "does NOT fit" in out


def test_budget_accepts_a_config_path(capsys, tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = run(capsys, "budget", "--model", str(path), "--json")
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 2 * 2 * 4 * 16 * 2


def test_does_not_fit_is_a_result(capsys):
    code, out, _ = run(capsys, "budget", "--model", "llama-3.1-70b", "--hardware", "rtx-4090", "--json")
    r = json.loads(out)
    assert code == 0 and r["fits"] is False and r["max_batch"] == 0


@pytest.mark.parametrize("argv,fragment", [
    (["budget", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["budget", "--model", "article-7b", "--hardware", "h300"], "unknown hardware 'h300'"),
    (["budget", "--model", "article-7b", "--batch", "-1"], "batch must be >= 1"),
    (["budget", "--model", "article-7b", "--batch", "0"], "batch must be >= 1"),
    (["budget", "--model", "article-7b", "--batch", "nan"], "finite"),
    (["budget", "--model", "article-7b", "--batch", "1e30"], "batch must be <="),
    (["budget", "--model", "article-7b", "--context", "inf"], "finite"),
    (["budget", "--model", "article-7b", "--bandwidth", "0"], "bandwidth"),
    (["budget", "--model", "article-7b", "--bandwidth", "abc"], "expected a number"),
    (["budget", "--model", "article-7b", "--efficiency", "2"], "efficiency must be <= 1"),
    (["budget", "--model", "article-7b", "--kv-dtype", "fp9"], "unknown dtype 'fp9'"),
    (["budget", "--model", "article-7b", "--weight-dtype", "int3"], "unknown dtype"),
    (["budget", "--model", "/nonexistent/config.json"], "does not exist"),
    (["budget"], "--model"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_malformed_config_file(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096')
    code, _, err = run(capsys, "budget", "--model", str(path))
    assert code == 2 and "not valid JSON" in err


def test_models_and_hardware_json(capsys):
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0 and json.loads(out)["llama-3.1-8b"]["kv_bytes_per_token_fp16"] == 131072
    code, out, _ = run(capsys, "hardware", "--json")
    hw = json.loads(out)
    assert code == 0 and hw["tiers"]["ib-200g"]["bandwidth_bytes_per_s"] == 25e9
    assert hw["devices"]["h200"]["capacity_bytes"] == 141e9


def test_console_script_runs_without_heavy_imports():
    code = ("import sys; from kvlab.cli import main; main(['budget','--model','article-7b','--json']); "
            "heavy = [m for m in ('torch', 'bokeh', 'ipywidgets') if m in sys.modules]; "
            "sys.stderr.write(repr(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.strip() == "[]"
    proc = subprocess.run([sys.executable, "-m", "kvlab", "budget", "--model", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_bench_ledger_reports_both_timings(capsys):
    code, out, _ = run(capsys, "bench", "ledger", "--points", "1000", "--loop-points", "50", "--json")
    r = json.loads(out)
    assert code == 0 and r["points"] == 1000 and r["loop_points"] == 50
    assert r["vectorised_s"] > 0 and r["loop_s"] > 0
