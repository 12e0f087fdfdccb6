"""`kvlab bench BENCHMARK ...`: microbenchmarks. Each module in BENCH_COMMANDS registers one
benchmark on the `bench` sub-parser; torch is imported only when a benchmark runs."""

from __future__ import annotations

import importlib

from . import Parser

BENCH_COMMANDS: tuple[str, ...] = (
    "kvlab.cli.bench_kv_transfer",
    "kvlab.cli.bench_memory",
    "kvlab.cli.bench_transfer",
    "kvlab.cli.bench_decode",
    "kvlab.cli.bench_recompute",
    "kvlab.cli.bench_suite",
    "kvlab.cli.bench_ledger",
)


def register(sub) -> None:
    p = sub.add_parser("bench", help="microbenchmarks: results as JSON under results/<machine>/")
    bench = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=Parser)
    bench.required = True
    for name in BENCH_COMMANDS:
        importlib.import_module(name).register(bench)
