"""A deployment to budget: model, device, dtypes, efficiency and the device overrides.

The ledger's functions take these as a long parameter list (the CLI contract and the book
call them that way); code that asks several questions of one deployment (the tier model,
the simulator, the diagnosis) builds a `Scenario` once and passes it along instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import cost
from .dtypes import DType
from .hardware import Device
from .models import ModelSpec


@dataclass(frozen=True)
class Scenario:
    """One model on one device with its dtypes; `efficiency` scales bandwidth and FLOP/s
    (1.0 is the physical ceiling); `bandwidth_bytes_per_s` and `capacity_bytes` override
    the device's memory (to budget with a measured figure, or a share of HBM);
    `tensor_parallel` splits the model over that many of the device's GPUs (figures per
    GPU, tokens/s the group's)."""

    model: ModelSpec | str
    hardware: Device | str
    weight_dtype: str | DType = "fp16"
    kv_dtype: str | DType = "fp16"
    efficiency: float = 1.0
    bandwidth_bytes_per_s: float | None = None
    capacity_bytes: float | None = None
    tensor_parallel: int = 1

    def replace(self, **changes) -> Scenario:
        return dataclasses.replace(self, **changes)

    def decode_step(self, batch=1, context=4096) -> cost.DecodeStep:
        return cost.decode_step(
            self.model,
            self.hardware,
            batch,
            context,
            self.weight_dtype,
            self.kv_dtype,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            efficiency=self.efficiency,
            capacity_bytes=self.capacity_bytes,
            tensor_parallel=self.tensor_parallel,
        )

    def prefill(
        self, prompt_tokens, cached_tokens=0, batch=1, flash_attention: bool = True
    ) -> cost.Prefill:
        return cost.prefill(
            self.model,
            self.hardware,
            prompt_tokens,
            cached_tokens,
            batch,
            self.weight_dtype,
            self.kv_dtype,
            self.efficiency,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            flash_attention=flash_attention,
            tensor_parallel=self.tensor_parallel,
        )

    def memory_fit(self, batch=1, context=4096) -> cost.MemoryFit:
        return cost.memory_fit(
            self.model,
            self.hardware,
            batch,
            context,
            self.weight_dtype,
            self.kv_dtype,
            self.capacity_bytes,
            tensor_parallel=self.tensor_parallel,
        )

    def speculative_step(
        self, batch=1, context=4096, speculative_tokens=4, acceptance=0.7, draft_model=None
    ):
        """Speculative decoding on this deployment (`kvlab.speculative`)."""
        from .speculative import speculative_step

        return speculative_step(
            self.model,
            self.hardware,
            batch,
            context,
            speculative_tokens,
            acceptance,
            draft_model,
            self.weight_dtype,
            self.kv_dtype,
            self.bandwidth_bytes_per_s,
            self.efficiency,
            self.capacity_bytes,
            self.tensor_parallel,
        )

    @property
    def kv_bytes_per_token(self) -> float:
        return cost.kv_bytes_per_token(self.model, self.kv_dtype)
