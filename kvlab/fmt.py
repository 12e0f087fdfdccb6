"""Human-readable quantities for tables, readouts and prose (SI prefixes: 1 GB = 1e9 B).

The same rules format the CLI's tables, the numbers glued into the book, and, mirrored in
`kvlab/viz/js/kvlab.js`, the static panels' readouts; the browser test checks that both
sides print the same text. Rounding is half away from zero on the exact binary value
(what JavaScript's toFixed does), and magnitudes are found with IEEE multiply/divide
only, so Python and JavaScript agree digit for digit.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str, digits: int = 3) -> str:
    """1.45e10, 'B' -> '14.5 GB'; 3 significant digits by default."""
    if value is None or not math.isfinite(value):
        return "unbounded" if value is not None and value > 0 else "n/a"
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{sig(value / scale, digits)} {prefix}{unit}"
    return f"{sig(value, digits)} {unit}"


def gib(value: float) -> str:
    """Binary gibibytes, for where the article states GiB (16 GiB of KV)."""
    return f"{sig(value / 2**30, 3)} GiB"


def seconds(value: float, digits: int = 3) -> str:
    """0.00727 -> '7.27 ms'."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{sig(value / scale, digits)} {unit}"
    return f"{sig(value / 1e-9, digits)} ns"


def rate(value: float, digits: int = 4) -> str:
    """Tokens per second: 4 significant digits, whole numbers past 1,000 (137.6, 12,346)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return sig(value, digits)


#: The most significant digits `percent` adds so that a share short of all never reads 100%.
PERCENT_MAX_DIGITS = 9


def percent(fraction: float, digits: int = 3) -> str:
    """0.953 -> '95.3%'. A share short of all never reads as all: 12,030 of 12,031 is
    '99.99%', not '100%' (one more digit at a time until it shows)."""
    text = sig(100 * fraction, digits)
    while fraction < 1 and digits < PERCENT_MAX_DIGITS and _value(text) >= 100:
        digits += 1
        text = sig(100 * fraction, digits)
    return f"{text}%"


def _value(text: str) -> float:
    return float(text.replace(",", ""))


#: Beyond these magnitudes fixed-point text is a wall of zeros (1e-300 would print 300 of
#: them), so `sig` writes scientific notation instead; no readout of the book gets there.
SCIENTIFIC_BELOW = 1e-6
SCIENTIFIC_FROM = 1e21


def sig(x: float, digits: int) -> str:
    """`digits` significant digits (never fewer than the integer part), with separators;
    scientific notation (1.00e-300) outside [1e-6, 1e21)."""
    a = abs(x)
    if math.isfinite(a) and a != 0 and not SCIENTIFIC_BELOW <= a < SCIENTIFIC_FROM:
        return f"{float(x):.{max(digits - 1, 0)}e}"
    return fixed(x, decimals_for(x, digits))


def decimals_for(x: float, digits: int) -> int:
    """Decimals that leave `digits` significant digits; magnitude found by IEEE ops only."""
    a = abs(x)
    if a == 0 or not math.isfinite(a):
        return 0
    exponent = 0
    while a >= 10:
        a /= 10
        exponent += 1
    while a < 1:
        a *= 10
        exponent -= 1
    return max(digits - 1 - exponent, 0)


def fixed(x: float, decimals: int) -> str:
    """Fixed-point with thousands separators, rounding half away from zero."""
    if not isinstance(x, (int, float)):
        x = float(x)  # numpy scalars
    q = Decimal(x).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    if q == 0:
        q = abs(q)  # no "-0.00"
    return f"{q:,f}"
