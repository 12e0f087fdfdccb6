"""The `kvlab` command line. Each module in COMMANDS registers its subcommands.

Contract: every subcommand can print one JSON object with `--json`; bad input gives one
line on stderr and exit status 2; anything else that escapes is a bug in kvlab, reported
in one line with exit status 70 (`KVLAB_DEBUG=1` shows the traceback). Only the module of
the command being run is imported, and heavy libraries (torch, bokeh) only by the commands
that need them, so `kvlab --help` and `kvlab budget` start fast.
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import os
import sys
import traceback
import unicodedata

from .. import __version__
from ..errors import KvlabError

#: command -> (module that registers it, one-line help for `kvlab --help`). The help
#: strings are the ones each module registers (tests/test_cli.py checks they agree), kept
#: here so that listing the commands imports none of them.
COMMANDS = {
    "models": ("kvlab.cli.catalog", "list the model catalogue (shapes, parameters, KV per token)"),
    "hardware": ("kvlab.cli.catalog", "list devices, memory tiers and links"),
    "budget": ("kvlab.cli.budget", "bytes, FLOPs, time and memory fit of one decode step"),
    "bench": ("kvlab.cli.bench", "microbenchmarks: results as JSON under results/<machine>/"),
    "trace": ("kvlab.cli.trace", "request traces: statistics, download"),
    "prefix-cache": (
        "kvlab.cli.prefix",
        "replay a trace through a prefix cache: block and token hit ratios, prefill saved",
    ),
    "diagnose": (
        "kvlab.cli.diagnose",
        "why is decode slow? the five-step diagnosis of a measurement",
    ),
    "simulate": (
        "kvlab.cli.simulate",
        "replay a trace on a colocated, disaggregated or KV-centric cluster (discrete-event)",
    ),
    "plan": (
        "kvlab.cli.plan",
        "search cluster designs for the most requests/s per GPU at the SLOs (process pool or Ray)",
    ),
    "dashboard": (
        "kvlab.cli.dashboard",
        "serve the live dashboard on 127.0.0.1 (Voila, offline): every lever at any value",
    ),
}

#: Commands whose numpy work is element-wise: OpenBLAS need not start a thread per core
#: when numpy loads (~20 ms of CPU at every start). `bench` keeps the machine's default.
NO_BLAS_THREADS = frozenset(COMMANDS) - {"bench"}

EXIT_USAGE = 2  # bad input: one line on stderr
EXIT_BUG = 70  # sysexits' EX_SOFTWARE: an internal error, never bad input
DEBUG_ENV = "KVLAB_DEBUG"


class UsageError(Exception):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and the exit status stays 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        raise UsageError(self.prog, message)


def add_command(sub, name: str, description: str) -> Parser:
    """The parser of subcommand `name`, with its one-line help from COMMANDS (the one place
    it is written: `kvlab --help` lists it without importing the command's module)."""
    return sub.add_parser(name, help=COMMANDS[name][1], description=description)


ALL = "*"


def build_parser(command: str | None = ALL) -> Parser:
    """The parser. With a `command`, only the module registering it is imported (the others
    appear by name and help: enough for `kvlab --help` and a usage error); ALL registers all."""
    parser = Parser(
        prog="kvlab",
        description="Why decode stays slow when the KV cache hits: the byte ledger, "
        "traces, simulators and benchmarks behind the kvlab book.",
    )
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    modules = dict.fromkeys(module for module, _ in COMMANDS.values())
    if command in COMMANDS:
        wanted = [COMMANDS[command][0]]
    else:
        wanted = list(modules) if command == ALL else []
    registered = set()
    for name in wanted:
        before = set(sub.choices)
        importlib.import_module(name).register(sub)
        registered |= set(sub.choices) - before
    for name, (_, help_text) in COMMANDS.items():
        if name not in registered:
            sub.add_parser(name, help=help_text)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    return next((word for word in argv if not word.startswith("-")), None)


#: What a terminal that cannot show a character gets instead (`PYTHONIOENCODING=ascii`, a
#: C locale): the usual ASCII spelling; anything else its accent-stripped form, or "?".
ASCII_SPELLING = {
    "µ": "u",
    "μ": "u",
    "×": "x",
    "—": "-",
    "–": "-",
    "−": "-",
    "→": "->",
    "←": "<-",
    "↔": "<->",
    "≤": "<=",
    "≥": ">=",
    "≠": "!=",
    "≈": "~",
    "±": "+/-",
    "·": ".",
    "•": "*",
    "…": "...",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "²": "^2",
    "³": "^3",
    "∞": "inf",
    "°": " deg",
    "\u00a0": " ",
    "\u202f": " ",
    "\u2009": " ",
}
_ERRORS = "kvlab-transliterate"


def _transliterate(exc: UnicodeError):
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out = []
    for ch in exc.object[exc.start : exc.end]:
        spelled = ASCII_SPELLING.get(ch)
        if spelled is None:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            spelled = plain or "?"
        out.append(spelled)
    return "".join(out), exc.end


def terminal_safe() -> None:
    """Make stdout and stderr print whatever their encoding cannot show as its ASCII spelling
    (kvlab's text uses µs, x, -> and Chinese): a terminal's encoding is never a crash."""

    try:
        codecs.lookup_error(_ERRORS)
    except LookupError:
        codecs.register_error(_ERRORS, _transliterate)
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding.startswith("utf"):
            continue
        try:
            stream.reconfigure(errors=_ERRORS)
        except (AttributeError, ValueError, OSError):  # replaced (tests), or closed
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    terminal_safe()
    command, args = _command(argv), None
    if command in NO_BLAS_THREADS and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
        if extra:
            raise unrecognized(parser, args, extra)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the net, not at exit
        return code
    except Exception as exc:  # noqa: BLE001 - the last net: bad input is exit 2, the rest a bug
        return report(f"kvlab {getattr(args, 'command', None) or ''}".strip(), exc)
    except KeyboardInterrupt:
        print("kvlab: interrupted", file=sys.stderr)
        return 130


#: Options users carry over from one command to another, and what to do instead.
CROSS_HINTS = {
    ("diagnose", "--efficiency"): "diagnose judges a measurement against the device's peak "
    "figures; for the ceiling with measured kernel efficiency run 'kvlab budget --model M "
    "--hardware H --efficiency measured' and compare its tokens_per_s",
}


def unrecognized(parser: Parser, args, extra: list[str]) -> UsageError:
    """One line for options the command does not take: named by the (sub)command they were
    given to, with where they belong when another command takes them."""
    path = [p for p in (getattr(args, "command", None), getattr(args, "benchmark", None)) if p]
    prog, sub = "kvlab", parser
    for name in path:
        action = next((a for a in sub._actions if a.choices and name in a.choices), None)
        if action is None:
            break
        sub, prog = action.choices[name], f"{prog} {name}"
    options = [e.split("=", 1)[0] for e in extra if e.startswith("--")]
    hints = []
    for option in options:
        hint = CROSS_HINTS.get((path[0] if path else "", option))
        if hint is None:
            others = _commands_taking(option)
            if others:
                hint = f"{option} is an option of {', '.join(repr(o) for o in others)}"
        if hint:
            hints.append(hint)
    message = f"unrecognized arguments: {' '.join(extra)}"
    return UsageError(prog, "; ".join([message, *hints]))


def _commands_taking(option: str) -> list[str]:
    """'kvlab budget', 'kvlab bench decode': every command whose parser takes `option`."""
    found = []

    def walk(p, prog):
        for action in p._actions:
            if option in action.option_strings and prog != "kvlab":
                found.append(prog)
            if action.choices and isinstance(action.choices, dict):
                for name, child in action.choices.items():
                    if isinstance(child, argparse.ArgumentParser):
                        walk(child, f"{prog} {name}")

    walk(build_parser(ALL), "kvlab")
    return sorted(set(found))


def report(prog: str, exc: BaseException) -> int:
    """The one line for an exception that reached the top: bad input (KvlabError) -> exit 2;
    a closed pipe (`kvlab models | head`) -> quiet exit 0; anything else is a bug in kvlab
    -> exit 70, with the traceback under KVLAB_DEBUG=1."""
    if isinstance(exc, UsageError):
        print(one_line(f"{exc.prog}: error: {exc} (see '{exc.prog} --help')"), file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, KvlabError):
        print(one_line(f"{prog}: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, BrokenPipeError):
        _silence_stdout()
        return 0
    if os.environ.get(DEBUG_ENV):
        traceback.print_exception(exc, file=sys.stderr)
    else:
        print(
            one_line(
                f"{prog}: internal error, a bug in kvlab: {type(exc).__name__}: {exc} "
                f"(run again with {DEBUG_ENV}=1 for the traceback, and please report it)"
            ),
            file=sys.stderr,
        )
    return EXIT_BUG


def guarded(entry, prog: str, argv: list[str] | None = None) -> int:
    """Run a `python -m` entry point `entry(argv) -> int` under the same last net as `kvlab`."""
    terminal_safe()
    try:
        return int(entry(argv) or 0)
    except Exception as exc:  # noqa: BLE001
        return report(prog, exc)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def one_line(text: str, limit: int = 2000) -> str:
    """Messages are one line (a hostile value may carry newlines), and not a megabyte long."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _silence_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush
    does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced (tests) or already closed
        pass
