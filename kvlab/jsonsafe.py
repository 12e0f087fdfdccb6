"""One JSON-cleaning rule for everything kvlab embeds in a page or writes as data.

numpy scalars and arrays become plain Python; inf and NaN become None (JSON has no
infinity: null means "unbounded" or "not measured" as the field's docs say); floats may be
rounded to `digits` significant digits (simulation outputs do not carry 17).
"""

from __future__ import annotations

import math

import numpy as np


def jsonable(obj, digits: int | None = None):
    """`obj` with every value JSON-ready (see the module docstring). Dict keys become str."""

    if isinstance(obj, dict):
        return {str(k): jsonable(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, digits) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), digits)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        if digits:
            return float(f"{obj:.{digits}g}")
    return obj
