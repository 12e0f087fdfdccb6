"""Human-readable quantities for tables, readouts and prose (SI prefixes: 1 GB = 1e9 B).

The same functions format the CLI's tables, the static panels' readouts (the browser
test compares them) and the numbers glued into the book, so each appears one way.
"""
from __future__ import annotations

import math

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str, digits: int = 3) -> str:
    """1.45e10, 'B' -> '14.5 GB'; 3 significant digits by default."""
    if value is None or not math.isfinite(value):
        return "unbounded" if value is not None and value > 0 else "n/a"
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{_sig(value / scale, digits)} {prefix}{unit}"
    return f"{_sig(value, digits)} {unit}"


def gib(value: float) -> str:
    """Binary gibibytes, for where the article states GiB (16 GiB of KV)."""
    return f"{_sig(value / 2**30, 3)} GiB"


def seconds(value: float, digits: int = 3) -> str:
    """0.00727 -> '7.27 ms'."""
    if value is None or not math.isfinite(value):
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{_sig(value / scale, digits)} {unit}"
    return f"{_sig(value / 1e-9, digits)} ns"


def rate(value: float, digits: int = 4) -> str:
    """Tokens per second with a thousands separator: 137.6, 12,345."""
    if value >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return _sig(value, digits)


def _sig(x: float, digits: int) -> str:
    if x == 0:
        return "0"
    decimals = max(digits - 1 - int(math.floor(math.log10(abs(x)))), 0)
    return f"{x:,.{decimals}f}"
