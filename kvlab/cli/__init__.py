"""The `kvlab` command line. Each module in COMMANDS registers its subcommands.

Contract: every subcommand can print one JSON object with `--json`; bad input gives
one line on stderr and exit status 2; heavy libraries (torch, bokeh) are imported only
by the commands that need them, so `kvlab budget` starts fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import KvlabError

COMMANDS = (
    "kvlab.cli.catalog",
    "kvlab.cli.budget",
    "kvlab.cli.bench",
    "kvlab.cli.trace",
    "kvlab.cli.prefix",
    "kvlab.cli.diagnose",
    "kvlab.cli.simulate",
)

EXIT_USAGE = 2


class UsageError(Exception):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and the exit status stays 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        raise UsageError(self.prog, message)


def build_parser() -> Parser:
    parser = Parser(
        prog="kvlab",
        description="Why decode stays slow when the KV cache hits: the byte ledger, "
        "traces, simulators and benchmarks behind the kvlab book.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{exc.prog}: error: {exc} (see '{exc.prog} --help')", file=sys.stderr)
        return EXIT_USAGE
    except KvlabError as exc:
        prog = f"kvlab {getattr(args, 'command', '')}".strip()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvlab models | head`
        return 0
