"""A deployment: what every ledger question is asked of.

One model on one kind of device, with its dtypes, the speed its kernels run at, the
tensor-parallel degree and any overrides of the device's figures. `kvlab.cost`,
`kvlab.tiers`, `kvlab.speculative`, the simulator's step pricing and the diagnosis all
take one `Deployment` instead of threading those arguments by hand.

The speed is typed: `Ceiling(efficiency)` is the sheet's bandwidth and FLOP/s times an
efficiency (1.0 is the physical ceiling; 0.6-0.85 is what real kernels reach);
`KernelTables()` times every operator from published kernel measurements (TensorRT-LLM's,
via aiconfigurator; `kvlab.kernel_tables`). The command line's `--efficiency measured`
is parsed into `KernelTables()` by `parse_speed` and nowhere below it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from .dtypes import DType, parse_dtype
from .errors import KvlabError, check_number
from .hardware import Device, get_device
from .models import ModelSpec, get_model
from .operators import Num, OperatorTable, check_tensor_parallel, operator_table

#: Upper and lower bounds beyond which an input is a typo rather than a configuration.
MAX_BANDWIDTH_BYTES_PER_S = 1e15  # 1 PB/s: 200x an H200
MIN_BANDWIDTH_BYTES_PER_S = 1e3  # 1 kB/s: slower than any memory or link KV crosses
MAX_CAPACITY_BYTES = 1e14
MIN_EFFICIENCY = 1e-3  # 0.1% of peak
#: What `--efficiency` accepts besides a number: the published kernel tables.
KERNEL_TABLES_WORD = "measured"


@dataclass(frozen=True)
class Ceiling:
    """The sheet's peaks times `efficiency` (a fraction in (0, 1]; arrays broadcast)."""

    efficiency: Num = 1.0

    def __post_init__(self):
        value = check_number(
            "efficiency",
            self.efficiency,
            minimum=MIN_EFFICIENCY,
            allow_equal_min=True,
            maximum=1.0,
        )
        object.__setattr__(self, "efficiency", value)

    @property
    def label(self):
        """What results report as their `efficiency`."""
        return self.efficiency

    source = "the sheet's bandwidth and FLOP/s x efficiency"


@dataclass(frozen=True)
class KernelTables:
    """Every operator timed from published kernel tables (devices with data only)."""

    label = KERNEL_TABLES_WORD
    efficiency = 1.0  # the tables' times are what they are; ceilings stay at the peaks


Speed = Ceiling | KernelTables


def parse_speed(value) -> Speed:
    """A speed from what a user typed: a number (an efficiency) or 'measured' (the
    published kernel tables). Only the command line and the panels' state call this."""
    if isinstance(value, (Ceiling, KernelTables)):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word == KERNEL_TABLES_WORD:
            return KernelTables()
        try:
            value = float(word)
        except ValueError:
            raise KvlabError(
                f"efficiency must be a number in (0, 1] or {KERNEL_TABLES_WORD!r}, got {value!r}"
            ) from None
    return Ceiling(value)


@dataclass(frozen=True)
class Deployment:
    """One model on one device: dtypes, speed, tensor parallelism, overrides.

    `tensor_parallel` splits the weights and K/V heads over that many GPUs of one server
    (figures per GPU, tokens/s the group's); `bandwidth_bytes_per_s` replaces the device's
    memory bandwidth (to budget with a measured figure; not with kernel tables);
    `capacity_bytes` replaces what weights + KV may fill (default: the device's usable
    memory, `hardware.USABLE_MEMORY_FRACTION` of it). Names are looked up on creation, so
    an unknown model, device or dtype fails here, with the valid names."""

    model: ModelSpec | str
    hardware: Device | str
    weight_dtype: DType | str = "fp16"
    kv_dtype: DType | str = "fp16"
    speed: Speed = Ceiling()
    tensor_parallel: int = 1
    bandwidth_bytes_per_s: Num | None = None
    capacity_bytes: Num | None = None

    def __post_init__(self):
        set_ = object.__setattr__
        model = get_model(self.model)
        set_(self, "model", model)
        set_(self, "hardware", get_device(self.hardware))
        set_(self, "weight_dtype", parse_dtype(self.weight_dtype))
        set_(self, "kv_dtype", parse_dtype(self.kv_dtype))
        if not isinstance(self.speed, (Ceiling, KernelTables)):
            raise KvlabError(
                f"speed must be Ceiling(efficiency) or KernelTables(), got {self.speed!r}"
            )
        tp = self.tensor_parallel
        if not (type(tp) is int and tp == 1):
            set_(self, "tensor_parallel", check_tensor_parallel(model, tp))
        if self.bandwidth_bytes_per_s is not None:
            if isinstance(self.speed, KernelTables):
                raise KvlabError(
                    f"efficiency {KERNEL_TABLES_WORD!r} times kernels from published tables; "
                    "a bandwidth override does not apply to it"
                )
            bw = check_number(
                "bandwidth (bytes/s)",
                self.bandwidth_bytes_per_s,
                minimum=MIN_BANDWIDTH_BYTES_PER_S,
                allow_equal_min=True,
                maximum=MAX_BANDWIDTH_BYTES_PER_S,
            )
            set_(self, "bandwidth_bytes_per_s", bw)
        if self.capacity_bytes is not None:
            capacity = check_number(
                "capacity (bytes)", self.capacity_bytes, maximum=MAX_CAPACITY_BYTES
            )
            set_(self, "capacity_bytes", capacity)

    def replace(self, **changes) -> Deployment:
        return dataclasses.replace(self, **changes)

    @cached_property
    def table(self) -> OperatorTable:
        """The ledger's operator table for this deployment (shared across deployments of
        the same model, dtypes and degree)."""
        return operator_table(self.model, self.weight_dtype, self.kv_dtype, self.tensor_parallel)

    @property
    def efficiency(self):
        """The fraction of the peaks the kernels reach (1.0 under kernel tables, whose
        ceilings stay at the peaks)."""
        return self.speed.efficiency

    @property
    def kernel_tables(self) -> bool:
        return isinstance(self.speed, KernelTables)

    @property
    def memory_bandwidth_bytes_per_s(self):
        """The bandwidth in use: the override, else the device's sheet figure."""
        bw = self.bandwidth_bytes_per_s
        return self.hardware.memory_bandwidth_bytes_per_s if bw is None else bw

    @property
    def peak_flops_per_s(self) -> float:
        """Dense peak at the weights' compute dtype (fp8 tensor cores for fp8 weights)."""
        return self.hardware.peak_flops_per_s(self.weight_dtype.compute)

    @property
    def usable_capacity_bytes(self):
        """What weights + KV may fill on one GPU."""
        own = self.capacity_bytes
        return self.hardware.usable_capacity_bytes if own is None else own

    @property
    def kv_bytes_per_token(self) -> float:
        """KV one token adds on one GPU, over all layers."""
        return self.table.kv_bytes_per_token

    @property
    def weight_bytes(self) -> float:
        """Weights one GPU holds."""
        return self.table.resident_weight_bytes
