"""Bytes per element for weights and KV, including group-wise quantization scales.

A dtype is named as `fp16`, `int4`, ... or with a quantization group as `int4-g128`:
every 128 elements share one scale of `scale_bytes` (fp16 by default), which adds
`scale_bytes / group` bytes per element (int4-g128: 0.5 + 2/128 = 0.515625 bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import KvlabError, unknown_name

#: Storage bits per element of each base dtype.
BITS_PER_ELEMENT = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}

#: Dtypes whose matrix products run on the device's fp8 tensor cores (W8A8); every
#: other dtype is dequantized and multiplied at bf16 rate (weight-only quantization).
FP8_COMPUTE = {"fp8"}

_NAME = re.compile(r"^(?P<base>[a-z0-9]+)(?:-g(?P<group>\d+))?$")


@dataclass(frozen=True)
class DType:
    """A storage format: base dtype, optional quantization group, scale size in bytes."""

    base: str
    group_size: int | None = None
    scale_bytes: float = 2.0

    @property
    def name(self) -> str:
        return self.base if self.group_size is None else f"{self.base}-g{self.group_size}"

    @property
    def bytes_per_element(self) -> float:
        """Bytes per stored element, scale overhead included."""
        size = BITS_PER_ELEMENT[self.base] / 8
        if self.group_size:
            size += self.scale_bytes / self.group_size
        return size

    @property
    def compute(self) -> str:
        """Which peak FLOP/s the matmuls run at: 'fp8' or 'bf16'."""
        return "fp8" if self.base in FP8_COMPUTE else "bf16"


def parse_dtype(name: str | DType) -> DType:
    """Parse `fp16`, `int4`, `int4-g128`...; unknown names raise with the valid list."""
    if isinstance(name, DType):
        return name
    match = _NAME.match(str(name).strip().lower())
    if not match or match["base"] not in BITS_PER_ELEMENT:
        raise unknown_name(
            "dtype",
            name,
            BITS_PER_ELEMENT,
            also="a 4/8-bit dtype with a scale group such as int4-g128",
        )
    group = match["group"]
    if group is not None:
        group = int(group)
        if not 1 <= group <= 1 << 20:
            raise KvlabError(f"quantization group in {name!r} must be between 1 and 1048576")
        if BITS_PER_ELEMENT[match["base"]] >= 16:
            raise KvlabError(f"{name!r}: a scale group only makes sense for 8- or 4-bit dtypes")
    return DType(match["base"], group)


def bytes_per_element(name: str | DType) -> float:
    """Bytes per element of a dtype name such as `bf16` or `int4-g128`."""
    return parse_dtype(name).bytes_per_element
