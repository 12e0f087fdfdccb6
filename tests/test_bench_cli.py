"""`kvlab bench`'s table, parsed only (nothing runs): the option lines become the argparse
options they say, and each row hands its benchmark the options it takes."""

from __future__ import annotations

import argparse

import pytest

from kvlab.cli import UsageError, build_parser
from kvlab.cli.bench import BENCHMARKS, add_options, kv_transfer_configs, sweep

ROWS = {b.name: b for b in BENCHMARKS}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser("bench").parse_args(["bench", *argv])


def test_an_option_line_is_the_argparse_option_it_says():
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(
        parser,
        """
        name ? =first: a positional
        --size int =4 <N>: a number
            that goes on
        --mode {a,b} =a: a choice
        --rate number =2.5: a float default
        --on ! or: one
        --off store_false >on: or the other
        --hidden: -
        """,
    )
    actions = {a.dest: a for a in parser._actions}
    assert actions["size"].help == "a number that goes on" and actions["size"].metavar == "N"
    assert actions["mode"].choices == ("a", "b") and actions["hidden"].help == argparse.SUPPRESS
    args = parser.parse_args(["x", "--size", "8", "--off"])
    assert (args.name, args.size, args.mode, args.rate, args.on) == ("x", 8, "a", 2.5, False)
    assert parser.parse_args([]).size == 4  # a default that reads as a number is one
    with pytest.raises(argparse.ArgumentError, match="not allowed with"):
        parser.parse_args(["--on", "--off"])
    with pytest.raises(KeyError):
        add_options(argparse.ArgumentParser(), "--x bogus: a word the grammar lacks")


def test_decode_gets_its_grid_and_its_own_options():
    """The checked grid (shared with --plan) plus the options only a run takes."""
    argv = "--preset tiny --prefetch both --weight-dtype BF16 --kv-dtypes int8,FP8"
    args = parse(
        "decode", *argv.split(), "--no-cuda-graph", "--compare-kernels", "--kernels", "torch"
    )
    checked = ROWS["decode"].check(args)
    assert checked == {
        "preset": "tiny",
        "batches": None,
        "contexts": None,
        "placements": None,
        "kv_dtypes": ["int8", "fp8"],
        "weight_dtype": "bf16",
        "prefetch": (False, True),
    }
    seen = {}
    sweep(lambda device, **kw: seen.update(kw), "kernels", "cuda_graph", "compare_kernels")(
        args, "cpu", checked
    )
    assert seen == {
        **checked,
        "kernels": "torch",
        "cuda_graph": False,
        "compare_kernels": True,
        "repeats": None,
        "budget_s": 900,
        "quick": False,
    }
    assert parse("decode").cuda_graph is True


@pytest.mark.parametrize(
    "argv,writes",
    [([], True), (["--quick"], False), (["--quick", "--save"], True), (["--no-save"], False)],
)
def test_kv_transfer_saves_full_runs_unless_told(argv, writes):
    args = parse("kv-transfer", "--engine", "torch", *argv)
    (config,) = kv_transfer_configs(args)
    assert config.engine == "torch" and args.no_write is not writes
    with pytest.raises(UsageError, match="not allowed with"):
        parse("kv-transfer", "--save", "--no-save")
