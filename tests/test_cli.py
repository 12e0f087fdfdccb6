"""The `kvlab` command line: the JSON contract, readable tables, bad input -> exit 2."""

import json
import os
import subprocess
import sys

import pytest

import kvlab.cli.catalog as catalog
from kvlab import cost, labs
from kvlab.cli import (
    ALL,
    ASCII_SPELLING,
    COMMANDS,
    _transliterate,
    build_parser,
    guarded,
    main,
    terminal_safe,
)
from kvlab.cli.args import count
from kvlab.deployment import Deployment
from kvlab.errors import KvlabError, check_number

BUDGET_KEYS = {
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_read_bytes",
    "step_bytes",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_sequence",
    "kv_cache_bytes",
    "fits",
    "max_batch",
    "bound",
    "arithmetic_intensity",
}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_budget_reproduces_the_article(capsys):
    code, out, err = run(
        capsys,
        "budget",
        "--model",
        "article-7b",
        "--bandwidth",
        "2e12",
        "--batch",
        "1",
        "--context",
        "4096",
        "--json",
    )
    assert code == 0 and err == ""
    r = json.loads(out)
    assert BUDGET_KEYS <= set(r)
    assert r["weight_bytes"] == 14e9
    assert r["kv_bytes_per_token"] == 131072
    assert r["kv_read_bytes"] == 536870912
    assert round(r["tokens_per_s"], 1) == 137.6
    assert r["bound"] == "memory" and r["fits"] is True


def test_budget_table_is_readable(capsys):
    code, out, _ = run(
        capsys,
        "budget",
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "l4",
        "--batch",
        "32",
        "--context",
        "8k",
    )
    assert code == 0
    assert "weights read" in out and "KV history read" in out and "does NOT fit" in out


def test_budget_accepts_a_config_path(capsys, tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = run(capsys, "budget", "--model", str(path), "--json")
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 2 * 2 * 4 * 16 * 2


def test_does_not_fit_is_a_result(capsys):
    code, out, _ = run(
        capsys, "budget", "--model", "llama-3.1-70b", "--hardware", "rtx-4090", "--json"
    )
    r = json.loads(out)
    assert code == 0 and r["fits"] is False and r["max_batch"] == 0


@pytest.mark.parametrize(
    "argv,fragment",
    [
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
    ],
)
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
    code = (
        "import sys; from kvlab.cli import main; main(['budget','--model','article-7b','--json']); "
        "heavy = [m for m in ('torch', 'bokeh', 'ipywidgets') if m in sys.modules]; "
        "sys.stderr.write(repr(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.strip() == "[]"
    proc = subprocess.run(
        [sys.executable, "-m", "kvlab", "budget", "--model", "nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_bench_ledger_reports_both_timings(capsys):
    code, out, _ = run(
        capsys, "bench", "ledger", "--points", "1000", "--loop-points", "50", "--json"
    )
    r = json.loads(out)
    assert code == 0 and r["points"] == 1000 and r["loop_points"] == 50
    assert r["vectorised_s"] > 0 and r["loop_s"] > 0


# ------------------------------------------------------------------ the last net


def test_an_escaping_exception_is_one_line_naming_a_bug(capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("the ledger fell over\nsecond line")

    monkeypatch.setattr(catalog, "run_models", broken)
    monkeypatch.delenv("KVLAB_DEBUG", raising=False)
    code, out, err = run(capsys, "models")
    assert code == 70 and out == ""
    assert err.count("\n") == 1 and "bug in kvlab" in err and "KVLAB_DEBUG=1" in err
    assert "RuntimeError: the ledger fell over second line" in err and "Traceback" not in err
    monkeypatch.setenv("KVLAB_DEBUG", "1")
    code, _, err = run(capsys, "models")
    assert code == 70 and err.startswith("Traceback") and "RuntimeError" in err


def test_python_m_entry_points_share_the_net(capsys, monkeypatch):
    def bad_input(argv):
        raise KvlabError("no such folder")

    def bug(argv):
        raise KeyError("x")

    monkeypatch.delenv("KVLAB_DEBUG", raising=False)
    assert guarded(bad_input, "kvlab labs") == 2
    assert capsys.readouterr().err == "kvlab labs: error: no such folder\n"
    assert guarded(bug, "kvlab labs") == 70
    assert "bug in kvlab" in capsys.readouterr().err
    assert guarded(labs.main, "kvlab labs", ["--nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_closed_pipe_is_a_quiet_success():
    done = subprocess.run(
        f"'{sys.executable}' -m kvlab hardware | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stderr == ""


def test_help_and_version_import_no_command_and_no_numpy():
    code = (
        "import sys; from kvlab.cli import main\n"
        "for argv in (['--version'], ['--help']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "loaded = [m for m in sys.modules if m == 'numpy' or m.startswith('kvlab.cli.')]\n"
        "sys.stderr.write(repr(loaded))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr == "[]"
    assert "prefix-cache" in done.stdout and "simulate" in done.stdout
    assert "kvlab 0.1.0" in done.stdout


def test_the_command_table_matches_what_each_module_registers():
    parser = build_parser(ALL)
    sub = next(a for a in parser._actions if a.dest == "command")
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {name: help_text for name, (_, help_text) in COMMANDS.items()}


# ------------------------------------------------------------------ silently wrong, now right


def test_a_whole_prompt_hit_still_computes_the_last_token(capsys):
    """`--cached 4k --context 4k`: the prompt's last token is always computed (its logits give
    the first output token), so TTFT is the prefill of one token over 4,095 cached, not 0."""
    code, out, _ = run(
        capsys, "budget", "--model", "llama-3.1-8b", "--cached", "4k", "--context", "4k", "--json"
    )
    r = json.loads(out)
    one = cost.prefill(Deployment("llama-3.1-8b", "h100-sxm"), 4096, cached_tokens=4095)
    assert code == 0 and r["cached_tokens"] == 4095 and r["ttft_s"] == one.ttft_s > 0


@pytest.mark.parametrize("option", ["--bandwidth", "--efficiency"])
def test_denormal_bandwidth_and_efficiency_are_refused(capsys, option):
    code, out, err = run(capsys, "budget", "--model", "article-7b", option, "1e-300", "--json")
    assert code == 2 and out == "" and "must be >=" in err and err.count("\n") == 1


def test_prefix_cache_capacity_overflow_is_refused_like_budget(capsys):
    """1e400 is not a number a float holds: budget refuses it, and so does prefix-cache
    (only the word 'inf' means an unlimited cache)."""
    code, _, err = run(capsys, "budget", "--model", "article-7b", "--batch", "1e400")
    assert code == 2 and "finite" in err
    for flag in ("--capacity-blocks", "--capacity-tokens"):
        code, out, err = run(capsys, "prefix-cache", "generated", flag, "1e400")
        assert code == 2 and out == "" and "'inf' for an unlimited cache" in err
    code, out, _ = run(capsys, "prefix-cache", "generated", "--capacity-blocks", "inf", "--json")
    assert code == 0 and json.loads(out)["capacity_blocks"] is None


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--tier", "moon"], "unknown tier 'moon'"),
        (["--hardware", "h300"], "unknown hardware 'h300'"),
        (["--batch", "0"], "batch must be >= 1"),
        (["--batch", "nan"], "finite"),
    ],
)
def test_prefix_cache_checks_options_it_would_not_use(capsys, argv, fragment):
    """Without --model, --tier, --hardware and --batch play no part, but a typo in them is
    still an error, not silently ignored."""
    code, out, err = run(capsys, "prefix-cache", "generated", "--capacity-blocks", "100", *argv)
    assert code == 2 and out == "" and fragment in err


def test_blas_threads_are_not_started_for_element_wise_commands():
    code = (
        "import io, os, sys, contextlib\n"
        "from kvlab.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main([sys.argv[1], '--json'])\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for command, expected in (("models", "1"), ("bench", "None")):
        done = subprocess.run(
            [sys.executable, "-c", code, command], capture_output=True, text=True, env=env
        )
        assert done.stdout.strip() == expected, (command, done.stderr)


def test_models_shows_mla_as_a_latent(capsys):
    """MLA caches one latent and a RoPE key per token and layer, not K/V heads."""
    assert main(["models", "--json"]) == 0
    v3 = json.loads(capsys.readouterr().out)["deepseek-v3"]
    assert v3["kv_heads"] is None and (v3["kv_latent_dim"], v3["kv_rope_dim"]) == (512, 64)
    assert v3["kv_bytes_per_token_fp16"] == (512 + 64) * 61 * 2
    assert main(["models"]) == 0
    row = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("deepseek-v3")
    )
    assert "128/latent" in row and "512+64 rope" in row


ASCII_COMMANDS = [
    ["models"],
    ["hardware"],
    ["budget", "--model", "llama-3.1-8b", "--hardware", "h100-sxm"],
    ["budget", "--model", "llama-3.1-8b", "--efficiency", "measured"],
    ["diagnose", "--model", "llama-3.1-70b", "--hardware", "l4", "--tokens-per-s", "1"],
    ["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "30", "--kv-tier", "host-pcie5"],
    ["trace", "stats", "generated:shared-prefix"],
    ["prefix-cache", "generated:shared-prefix", "--capacity-blocks", "64"],
    ["simulate", "poisson:rate=2,prompt=512,output=16,requests=20", "--arch", "colocated"],
    ["bench", "gpu-suite", "--plan", "h200"],
    ["bench", "decode", "--plan", "h200"],
    ["bench", "memory", "--plan", "l4"],
    ["budget", "--model", "nope"],  # an error line too
]


@pytest.mark.parametrize("argv", ASCII_COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_text_output_on_an_ascii_terminal(argv):
    """PYTHONIOENCODING=ascii (a C locale, an old console): every command prints, µs as us,
    x for the times sign, ASCII for the rest; never a UnicodeEncodeError (exit 70)."""
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "KVLAB_NATIVE": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", *argv], capture_output=True, env=env, timeout=300
    )
    assert done.returncode in (0, 2), done.stderr.decode(errors="replace")[-2000:]
    out, err = done.stdout.decode("ascii"), done.stderr.decode("ascii")  # ASCII, or this raises
    assert "internal error" not in err
    assert (done.returncode == 0 and out) or (done.returncode == 2 and err.count("\n") == 1)


def test_ascii_spellings_are_ascii_and_keep_the_meaning():
    terminal_safe()  # registers the handler (every `kvlab` run does, first)
    assert all(spelled.isascii() for spelled in ASCII_SPELLING.values())
    text = "4.64 µs × 2 ≥ 3 → é 中"
    assert text.encode("ascii", errors="kvlab-transliterate") == b"4.64 us x 2 >= 3 -> e ?"
    with pytest.raises(UnicodeDecodeError):
        _transliterate(UnicodeDecodeError("ascii", b"\xff", 0, 1, "bad"))


@pytest.mark.parametrize(
    "argv,prog,hint",
    [
        (["bench", "decode", "--bogus", "1"], "kvlab bench decode", None),
        (
            ["budget", "--model", "llama-3.1-8b", "--tokens-per-s", "3"],
            "kvlab budget",
            "--tokens-per-s is an option of 'kvlab diagnose'",
        ),
        (
            [
                "diagnose",
                "--model",
                "llama-3.1-8b",
                "--tokens-per-s",
                "100",
                "--efficiency",
                "measured",
            ],
            "kvlab diagnose",
            "'kvlab budget --model M --hardware H --efficiency measured'",
        ),
    ],
)
def test_an_unknown_option_points_at_its_command_and_where_it_belongs(capsys, argv, prog, hint):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: unrecognized arguments: ") and err.count("\n") == 1
    assert err.rstrip().endswith(f"(see '{prog} --help')") and "see 'kvlab --help'" not in err
    if hint:
        assert hint in err


def test_the_largest_documented_seed_survives_parsing_exactly(capsys):
    """2**63 - 1 has no float: parsed as one it became 2**63 and was refused (or silently
    changed). Whole numbers that large stay int from the command line to the range check."""

    top = 2**63 - 1
    assert count(str(top)) == top and type(count(str(top))) is int
    assert count("4k") == 4096.0 and count("1e3") == 1000.0  # the rest as before
    assert (
        check_number("seed", top, minimum=0, allow_equal_min=True, maximum=top, integer=True) == top
    )
    with pytest.raises(KvlabError, match="seed must be <= 9.22337e"):
        check_number("seed", top + 1, minimum=0, allow_equal_min=True, maximum=top, integer=True)
    argv = ["simulate", "poisson:rate=1,prompt=100,output=10,requests=3", "--arch", "colocated"]
    assert main([*argv, "--seed", str(top), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["seed"] == top
