"""Fuzz the command line as a hostile user would: every numeric option of every command gets
hostile and random numbers, config.json files are mutated (types swapped, fields removed or
nulled, extreme values, deep nesting), trace lines likewise.

Every run must end with exit status 0 or 2 (70 is "a bug in kvlab", a failure here), no
traceback, one line on stderr for a 2, and any JSON printed must parse strictly, with
finite numbers or null. The options come from the parsers themselves, so a new option is
fuzzed without touching this file. Seeds are fixed (derandomize): the same cases run every
time, well under a minute in all. Benchmarks are never run: `bench` options are parsed only.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlab.cli
from kvlab.cli import ALL, UsageError, build_parser, main
from kvlab.cli.bench import check_gpu_session
from kvlab.errors import KvlabError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"

#: Numbers a hostile user types: zero, negatives, NaN and infinities, overflow (1e400),
#: denormals, suffixes, float-looking text Python accepts and text it does not.
HOSTILE = [
    "0",
    "-1",
    "1",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "infinity",
    "1e400",
    "-1e400",
    "1e-300",
    "5e-324",
    "1e308",
    "1e15",
    "4k",
    "1M",
    "1.5",
    "0.5",
    "-0",
    "2e12",
    "99999999999999999999999",
    "1_000",
    "0x10",
    "abc",
    "",
    " ",
    "1e",
    "--",
    "NaNk",
    "1e400k",
    "\u0661\u0662",
]
FUZZ = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
numbers = st.one_of(
    st.sampled_from(HOSTILE),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.integers(0, 10**7).map(lambda n: f"{n}k"),
)


@pytest.fixture(scope="module", autouse=True)
def _one_parser_per_command():
    """main() builds its parser once per command here, as a long-lived process would, not
    once per case: building one (every subcommand, argparse's gettext look-ups) cost a third
    of this file's time, 3,000 times over. Parsing takes nothing from a parser but its
    definitions (each parse fills a new namespace), so every case parses as on a fresh one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kvlab.cli, "build_parser", functools.cache(kvlab.cli.build_parser))
        yield


@pytest.fixture(autouse=True)
def _results_elsewhere(tmp_path_factory, monkeypatch):
    """A case that ran a benchmark by mistake (`--plan ''` once did) writes here, not into
    the repository's results/ (which the book plots)."""
    monkeypatch.setenv("KVLAB_RESULTS_DIR", str(tmp_path_factory.mktemp("results")))


def run(argv: list[str]) -> tuple[int, str, str]:
    """main(argv) in process; checks the contract and returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    stdout, stderr = out.getvalue(), err.getvalue()
    assert code in (0, 2), f"kvlab {' '.join(argv)}: exit {code}: {stderr}"
    assert "Traceback" not in stderr, stderr
    if code == 2:
        assert stdout == "" and stderr.count("\n") == 1 and stderr.endswith("\n"), (argv, stderr)
    elif "--json" in argv:
        strict_json(stdout)
    return code, stdout, stderr


def strict_json(text: str):
    def constant(name):
        raise AssertionError(f"{name} in the JSON output")

    obj = json.loads(text, parse_constant=constant)
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            assert not isinstance(item, float) or math.isfinite(item), text[:200]
    return obj


def typed_options(*path: str) -> list[str]:
    """The options of a (sub)command that take a typed value (numbers, counts, lists)."""
    parser = build_parser(ALL)
    for name in path:
        sub = next(a for a in parser._actions if a.choices and name in a.choices)
        parser = sub.choices[name]
    return sorted(
        a.option_strings[-1] for a in parser._actions if a.option_strings and a.type is not None
    )


def fuzz(argv_for):
    """Every hostile number, then random ones, through argv_for(value)."""
    for value in HOSTILE:
        run(argv_for(value))

    @FUZZ
    @given(numbers)
    def random_values(value):
        run(argv_for(value))

    random_values()


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory) -> str:
    """Six requests that share a first block: enough for every trace command, fast."""
    lines = []
    for i in range(6):
        tokens = 700 + 300 * i
        lines.append(
            json.dumps(
                {
                    "timestamp": 500 * i,
                    "input_length": tokens,
                    "output_length": 20 + i,
                    "hash_ids": list(range(1, 1 + -(-tokens // 512))),
                }
            )
        )
    path = tmp_path_factory.mktemp("trace") / "tiny.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ------------------------------------------------------------------ numeric options

BUDGET = ["budget", "--model", "article-7b", "--json"]
DIAGNOSE = ["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "100", "--json"]


@pytest.mark.parametrize("option", typed_options("budget"))
def test_budget_numbers(option):
    fuzz(lambda v: BUDGET + [option, v])


@pytest.mark.parametrize("option", typed_options("diagnose") + ["--network"])
def test_diagnose_numbers(option):
    partner = {
        "--network": ["--kv-bytes-per-request", "1e9"],
        "--kv-bytes-per-request": ["--network", "ib-200g"],
    }
    fuzz(lambda v: DIAGNOSE + partner.get(option, []) + [option, v])


@pytest.mark.parametrize("option", typed_options("prefix-cache"))
def test_prefix_cache_numbers(option, tiny_trace):
    capacity = [] if option.startswith("--capacity") else ["--capacity-blocks", "4"]
    base = ["prefix-cache", tiny_trace, *capacity, "--model", "llama-3.1-8b", "--json"]
    fuzz(lambda v: base + [option, v])


@pytest.mark.parametrize("option", typed_options("simulate"))
def test_simulate_numbers(option, tiny_trace):
    fuzz(lambda v: ["simulate", tiny_trace, "--arch", "colocated", "--json", option, v])


SATURATION_OPTIONS = ["--attainment", "--tolerance", "--seeds", "--rate-scale", "--warmup"]


@pytest.mark.parametrize("option", SATURATION_OPTIONS)
def test_simulate_saturation_numbers(option, tiny_trace):
    """A saturation search with hostile numbers: a search, or one line and exit 2."""
    base = ["simulate", tiny_trace, "--arch", "colocated", "--saturation", "--json"]
    fuzz(lambda v: base + [option, v])


#: Values a hostile user gives each field of a generated workload (`poisson:...`).
LENGTHS = ["1", "512", "lognormal(1024,0.5)", "uniform(5,2)", "uniform(1,3)", "exponential(0)"]
LENGTHS += ["normal(100,1e9)", "lognormal(1e6,4)", "gamma(1,2)", "1e7", "1e8", "(", "1)", "0"]
POISSON_VALUES = {
    "rate": ["4", "1e-15", "1e-308", "1e6", "1e7", "0", "-1", "nan", "inf", "x", ""],
    "prompt": LENGTHS,
    "output": LENGTHS,
    "requests": ["1", "30", "0", "-1", "2.5", "1e7", "1e400", "nan", ""],
    "seed": ["0", "7", "-1", str(2**63 - 1), str(2**63), "1e30", "nan"],
    "shared": ["0", "0.5", "1", "1.5", "-0.1", "nan", "inf", "x"],
    "prefix": ["1", "512", "4096", "0", "2.5", "1e7", "1e8", "nan"],
    "prefixes": ["1", "3", "0", "1e6", "1e7", "nan"],
    "bogus": ["1"],
}
poisson_specs = st.lists(
    st.sampled_from(sorted(POISSON_VALUES)).flatmap(
        lambda k: st.sampled_from(POISSON_VALUES[k]).map(lambda v, k=k: f"{k}={v}")
    ),
    min_size=0,
    max_size=8,
).map(lambda fields: "poisson:" + ",".join(fields))


def test_workload_strings():
    """Generated workloads as the trace argument, every field hostile: a trace (and a short
    run of it), or one line and exit 2; never a traceback, a hang or memory exhausted."""
    fixed = [
        "poisson:rate=1e-15,prompt=10,output=5,requests=3",
        "poisson:rate=1e-308,prompt=10,output=5,requests=2",
        "poisson:rate=10,prompt=100,output=1000,requests=1e5",
        "poisson:rate=10,prompt=1e7,output=5,requests=1e4",
        "poisson:rate=4,prompt=19019,output=72,requests=30,prefix=16384,prefixes=20",
        "poisson:rate=4,prompt=8088,output=229,requests=30,shared=0.5",
    ]

    def check(spec):
        run(["trace", "stats", spec, "--json"])
        run(["simulate", spec, "--arch", "colocated", "--limit", "30", "--json"])

    for spec in fixed:
        check(spec)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(poisson_specs)
    def random_specs(spec):
        check(spec)

    random_specs()


def test_every_command_combines_hostile_numbers(tiny_trace):
    """All of a command's numeric options at once, random values."""
    commands = {
        "budget": (BUDGET, typed_options("budget")),
        "diagnose": (DIAGNOSE + ["--network", "ib-200g"], typed_options("diagnose")),
        "prefix-cache": (
            ["prefix-cache", tiny_trace, "--model", "llama-3.1-8b", "--json"],
            [o for o in typed_options("prefix-cache") if o != "--capacity-tokens"],
        ),
    }

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(sorted(commands)), st.data())
    def combined(name, data):
        base, options = commands[name]
        argv = list(base)
        for option in options:
            argv += [option, data.draw(numbers, label=option)]
        run(argv)

    combined()


def _bench_options():
    return [
        (bench, option)
        for bench in sorted(
            build_parser(ALL)
            ._subparsers._group_actions[0]
            .choices["bench"]
            ._subparsers._group_actions[0]
            .choices
        )
        for option in typed_options("bench", bench)
    ]


@pytest.mark.parametrize("bench,option", _bench_options())
def test_bench_options_parse_or_fail_as_usage(bench, option):
    """Parsed only (never run): a value either parses or is a one-line usage error."""
    parser = build_parser("bench")

    def parse(value):
        try:
            parser.parse_args(["bench", bench, option, value])
        except UsageError:
            pass

    for value in HOSTILE:
        parse(value)

    @FUZZ
    @given(numbers)
    def random_values(value):
        parse(value)

    random_values()


#: Names a hostile user types: empty, paths that are not files, devices, too long for the
#: file system, NUL bytes, control characters, near misses.
NAMES = [
    "",
    " ",
    "-",
    ".",
    "..",
    "/",
    "/dev/zero",
    "/dev/null",
    "/proc/self/mem",
    "/etc/passwd",
    "x" * 5000,
    "y" * 300 + ".json",
    "/tmp/" + "z" * 300 + "/config.json",
    "a\x00b",
    "\n",
    "int4-g0",
    "int4-g1e400",
    "fp8-g-1",
    "h100",
    "H100-SXM",
    "ib-200G",
    "hbm",
    "llama-3.1-8b.json",
    "generated:",
    "generated::1",
    "generated:x:99999999999999999999",
    "conversation\x00",
    "\u2028",
]
names = st.one_of(st.sampled_from(NAMES), st.text(max_size=40))


def string_options(*path: str) -> list[str]:
    """The options of a (sub)command that take a free-form name (not a number, not a flag)."""
    parser = build_parser(ALL)
    for name in path:
        sub = next(a for a in parser._actions if a.choices and name in a.choices)
        parser = sub.choices[name]
    return sorted(
        a.option_strings[-1]
        for a in parser._actions
        if a.option_strings
        and a.type is None
        and a.nargs is None
        and a.const is None
        and not a.choices
        and a.dest != "help"
    )


def fuzz_names(argv_for):
    for value in NAMES:
        run(argv_for(value))

    @FUZZ
    @given(names)
    def random_values(value):
        run(argv_for(value))

    random_values()


@pytest.mark.parametrize(
    "command,option",
    [("budget", o) for o in string_options("budget")]
    + [("diagnose", o) for o in string_options("diagnose")]
    + [("prefix-cache", o) for o in string_options("prefix-cache")],
)
def test_names_in_every_string_option(command, option, tiny_trace):
    base = {
        "budget": BUDGET,
        "diagnose": DIAGNOSE + ["--kv-bytes-per-request", "1e9", "--network", "ib-200g"],
        "prefix-cache": [
            "prefix-cache",
            tiny_trace,
            "--capacity-blocks",
            "4",
            "--model",
            "llama-3.1-8b",
            "--json",
        ],
    }[command]
    fuzz_names(lambda v: base + [option, v])


def test_names_as_traces():
    fuzz_names(lambda v: ["trace", "stats", v, "--json"])
    fuzz_names(lambda v: ["prefix-cache", v, "--capacity-blocks", "4", "--json"])


def test_trace_download_names_and_urls(tmp_path):
    """Never reaches the network: every value here is refused before a connection is made."""
    for value in NAMES:
        run(["trace", "download", "synthetic", "--base-url", value, "--dir", str(tmp_path / "d")])
        run(["trace", "download", value, "--dir", str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


def test_catalogues_and_trace_stats(tiny_trace):
    for argv in (
        ["models", "--json"],
        ["hardware", "--json"],
        ["trace", "stats", tiny_trace, "--json"],
        ["trace", "stats", "generated:shared-prefix", "--json"],
    ):
        assert run(argv)[0] == 0


# ------------------------------------------------------------------ mutated config.json files


def _nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


SWAPS = [
    None,
    "32",
    "",
    [],
    {},
    True,
    False,
    -1,
    0,
    0.5,
    1e308,
    10**40,
    float("nan"),
    float("inf"),
    [32],
    {"x": 32},
    "null",
]
mutation = st.one_of(
    st.tuples(st.just("remove"), st.none()),
    st.tuples(st.just("set"), st.sampled_from(SWAPS)),
    st.tuples(st.just("set"), st.integers(-(10**12), 10**12)),
    st.tuples(st.just("nest"), st.sampled_from([10, 900, 5000, 50_000])),
)


@pytest.mark.parametrize("config", sorted(p.parent.name for p in CONFIGS.glob("*/config.json")))
def test_mutated_published_configs(config, tmp_path_factory):
    original = json.loads((CONFIGS / config / "config.json").read_text())
    keys = sorted(original) + ["_kvlab"]
    folder = tmp_path_factory.mktemp("cfg")
    counter = iter(range(10**6))

    @settings(max_examples=25, deadline=None, derandomize=True, database=None)
    @given(st.lists(st.tuples(st.sampled_from(keys), mutation), min_size=1, max_size=3))
    def mutated(changes):
        cfg = dict(original)
        for key, (kind, value) in changes:
            if kind == "remove":
                cfg.pop(key, None)
            elif kind == "nest":
                cfg[key] = _nested(value)
            else:
                cfg[key] = value
        path = folder / f"{next(counter)}.json"
        try:
            path.write_text(json.dumps(cfg))  # NaN and Infinity are written as such: hostile too
        except RecursionError:
            path.write_text("[" * 50_000 + "]" * 50_000)
        run(["budget", "--model", str(path), "--json"])

    mutated()


def test_mutated_config_text(tmp_path):
    """Damage to the file itself: truncation, stray bytes, BOMs, literals JSON lacks."""
    text = (CONFIGS / "deepseek-ai--DeepSeek-V2-Lite-Chat" / "config.json").read_text()
    variants = [
        text[: len(text) // 2],
        text.replace("null", "None"),
        text.replace("false", "False"),
        text.replace("512", "512.5"),
        text.replace("512", "NaN"),
        text.replace("27", "-Infinity"),
        "\ufeff" + text,
        text.replace("{", "{{", 1),
        "",
        "null",
        "[]",
        "\x00" * 100,
        "{" * 200_000,
    ]
    for i, variant in enumerate(variants):
        path = tmp_path / f"{i}.json"
        path.write_text(variant, errors="surrogateescape")
        assert run(["budget", "--model", str(path), "--json"])[0] == 2
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert run(["budget", "--model", str(binary)])[0] == 2


# ------------------------------------------------------------------ mutated trace lines

FIELDS = ["timestamp", "input_length", "output_length", "hash_ids"]
line_mutation = st.one_of(
    st.tuples(st.sampled_from(FIELDS), st.sampled_from(["remove"] + SWAPS[:-1])),
    st.tuples(st.sampled_from(FIELDS), st.integers(-(10**30), 10**30)),
    st.tuples(st.sampled_from(FIELDS), st.lists(st.integers(-(2**70), 2**70), max_size=4)),
    st.tuples(
        st.just("line"),
        st.sampled_from(
            ["", "{", "[]", "null", "{}", "[" * 50_000, "\x00", '{"timestamp": 1e400}', "9" * 5000]
        ),
    ),
)


def test_mutated_trace_lines(tiny_trace, tmp_path_factory):
    lines = Path(tiny_trace).read_text().splitlines()
    folder = tmp_path_factory.mktemp("traces")
    counter = iter(range(10**6))

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(st.integers(0, len(lines) - 1), st.lists(line_mutation, min_size=1, max_size=3))
    def mutated(index, changes):
        obj = json.loads(lines[index])
        text = None
        for field, value in changes:
            if field == "line":
                text = value
            elif value == "remove":
                obj.pop(field, None)
            else:
                obj[field] = value
        copy = list(lines)
        copy[index] = text if text is not None else json.dumps(obj)
        path = folder / f"{next(counter)}.jsonl"
        path.write_text("\n".join(copy) + "\n")
        run(["trace", "stats", str(path), "--json"])
        run(["prefix-cache", str(path), "--capacity-blocks", "3", "--json"])

    mutated()


# ------------------------------------------------------------------ plans and the GPU session


def _plan_benches():
    """The benchmarks whose `--plan DEVICE` runs nothing (so the fuzz may run them whole)."""
    parser = build_parser("bench")
    bench = next(a for a in parser._actions if a.choices and "bench" in a.choices)
    subs = next(a for a in bench.choices["bench"]._actions if a.choices).choices
    return sorted(
        name for name, p in subs.items() if any("--plan" in a.option_strings for a in p._actions)
    )


#: The hostile numbers a plan is run with (a plan takes ~0.1-1 s: not the whole list).
PLAN_HOSTILE = ["0", "-1", "nan", "inf", "1e400", "5e-324", "1e15", "1.5", "abc", ""]


@pytest.mark.parametrize("bench", _plan_benches())
def test_plans_run_with_hostile_numbers(bench):
    """`--plan` allocates nothing: the options a plan uses are run through it, not only parsed
    (`--budget inf` printed an infinity the JSON refused: exit 70)."""
    for option in ("--budget", "--repeats"):
        for value in PLAN_HOSTILE:
            run(["bench", bench, "--plan", "h200", "--json", option, value])
    if bench == "decode":
        for value in NAMES:
            run(["bench", bench, "--plan", value, "--json"])
            run(["bench", bench, "--plan", "h200", "--plan-link", value, "--json"])


def test_bench_kernels_choice_refuses_everything_else():
    parser = build_parser("bench")
    for value in NAMES + ["auto ", "Native", "native,torch"]:
        with pytest.raises(UsageError):
            parser.parse_args(["bench", "decode", "--kernels", value])
    assert parser.parse_args(["bench", "decode", "--kernels", "native"]).kernels == "native"


def test_gpu_session_arguments(tmp_path):
    """kvlab bench gpu-session, parsed and checked (never run): a usage error or a parse,
    never another exception; --out names are kept under tmp_path."""

    parser = build_parser("bench")
    counter = iter(range(10**6))

    def parse(argv):
        try:
            check_gpu_session(parser.parse_args(["bench", "gpu-session", *argv]))
        except (UsageError, KvlabError) as exc:
            assert "\n" not in str(exc).strip()

    def out():
        return str(tmp_path / f"o{next(counter)}")

    for option in ("--deadline", "--budget"):
        for value in HOSTILE:
            parse(["--out", out(), option, value])

    @FUZZ
    @given(st.sampled_from(["--deadline", "--budget"]), numbers)
    def random_values(option, value):
        parse(["--out", out(), option, value])

    random_values()
    for value in NAMES:
        parse(["--out", f"{tmp_path}/{value}"])
        parse(["--out", out(), "--only", value])
        parse(["--out", out(), "--device", value])
