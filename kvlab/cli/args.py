"""Argument types shared by subcommands: counts with k/M suffixes, plain numbers.

They only parse; range checks happen in the API so CLI and library agree.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..jsonsafe import jsonable

_SUFFIX = {"k": 1024, "m": 1024 * 1024}


def count(text: str) -> float:
    """'4096', '4k' (= 4096, as in '4K context'), '1e3'. Returned as float for range checks,
    except whole numbers from 2**53 to 2**63 - 1 (64-bit seeds), which a float would round:
    those stay int."""
    t = text.strip().lower()
    scale = 1
    if t and t[-1] in _SUFFIX:
        t, scale = t[:-1], _SUFFIX[t[-1]]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 4096 or 4k, got {text!r}"
        ) from None
    digits = t.lstrip("+-")
    if 2**53 <= value <= 2**63 and scale == 1 and digits.isascii() and digits.isdigit():
        exact = int(t)
        if exact < 2**63:  # a 64-bit seed such as 2**63 - 1: a float would round it up
            return exact
    return value


def number(text: str) -> float:
    """A real number such as 2e12 or 0.8."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 2e12, got {text!r}") from None


def print_json(obj) -> None:
    """One JSON object on stdout; inf and NaN become null (kvlab.jsonsafe's rule: JSON has no
    infinity, and `--budget inf` must not turn a result into a crash)."""

    json.dump(jsonable(obj), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain, aligned text table (numbers right-aligned)."""
    cols = list(zip(header, *rows, strict=True))
    widths = [max(len(str(c)) for c in col) for col in cols]

    def fmt(row):
        cells = []
        for value, width in zip(row, widths, strict=True):
            value = str(value)
            numeric = value[:1].isdigit() or value[:1] in ("-", "+")
            cells.append(value.rjust(width) if numeric else value.ljust(width))
        return "  ".join(cells).rstrip()

    lines = [fmt(header), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)
