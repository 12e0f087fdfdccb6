"""One exception type for bad input, and the checks that raise it.

The CLI turns a `KvlabError` into one line on stderr and exit status 2; the API lets it
propagate. Every check names the quantity, the value it got and what would be valid, so
the message alone tells the user what to fix.
"""

from __future__ import annotations

import difflib
import math
from typing import Iterable


class KvlabError(ValueError):
    """Bad input: an unknown name, a nonsense number, a malformed file."""


def unknown_name(kind: str, name: str, valid: Iterable[str], also: str = "") -> KvlabError:
    """An error for an unknown catalogue name that lists the valid ones (and a guess)."""
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    tail = f", or {also}" if also else ""
    return KvlabError(f"unknown {kind} {name!r}.{hint} Valid: {', '.join(valid)}{tail}")


def check_number(
    name: str,
    value,
    *,
    minimum: float = 0.0,
    maximum: float = math.inf,
    allow_equal_min: bool = False,
    integer: bool = False,
):
    """Check a scalar or array of numbers: finite, within (minimum, maximum].

    Returns the value as a float/int or a numpy array so that ledger functions can
    broadcast. `maximum` guards against absurd inputs (a batch of 1e30) that would
    otherwise produce meaningless but plausible-looking output.
    """
    if type(value) is int and integer:  # exact: 2**63 - 1 must not become 2**63 as a float
        requirement = None
        if not (value >= minimum if allow_equal_min else value > minimum):
            requirement = f"{'>=' if allow_equal_min else '>'} {minimum:g}"
        elif not value <= maximum:
            requirement = f"<= {maximum:g}" if len(str(value)) < 400 else None
            if requirement is None:
                raise KvlabError(
                    f"{name} must be <= {maximum:g}, got a {len(str(value))}-digit number"
                )
        if requirement:
            raise KvlabError(f"{name} must be {requirement}, got {value!r}")
        return value
    if type(value) in (int, float):  # fast path: a plain Python number, no numpy
        try:
            v = float(value)
        except OverflowError:  # an int too big for a float
            raise KvlabError(
                f"{name} must be <= {maximum:g}, got a {len(str(value))}-digit number"
            ) from None
        requirement = None
        if not math.isfinite(v):
            requirement = "a finite number"
        elif not (v >= minimum if allow_equal_min else v > minimum):
            requirement = f"{'>=' if allow_equal_min else '>'} {minimum:g}"
        elif not v <= maximum:
            requirement = f"<= {maximum:g}"
        elif integer and v != round(v):
            requirement = "a whole number"
        if requirement:
            raise KvlabError(f"{name} must be {requirement}, got {value!r}")
        return int(v) if integer else v
    import numpy as np  # noqa: PLC0415 - here, not at the top: `kvlab --help` must not pay numpy's import

    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise KvlabError(f"{name} must be a number, got {value!r}") from None
    if arr.size == 0:
        raise KvlabError(f"{name} is empty")

    def fail(ok, requirement):
        if not np.all(ok):
            bad = value if arr.ndim == 0 else arr[~np.broadcast_to(ok, arr.shape)].ravel()[0].item()
            raise KvlabError(f"{name} must be {requirement}, got {bad!r}")

    fail(np.isfinite(arr), "a finite number")
    if allow_equal_min:
        fail(arr >= minimum, f">= {minimum:g}")
    else:
        fail(arr > minimum, f"> {minimum:g}")
    fail(arr <= maximum, f"<= {maximum:g}")
    if integer:
        fail(arr == np.round(arr), "a whole number")
    if arr.ndim == 0:
        return int(arr) if integer else float(arr)
    return arr.astype(np.int64) if integer else arr
