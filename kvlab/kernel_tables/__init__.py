"""Measured kernel latencies: the published tables behind the ledger's measured mode.

`kvlab/data/kernel_tables/` holds an extract of NVIDIA aiconfigurator-core 0.12.0's kernel
tables (TensorRT-LLM, Apache-2.0, see its NOTICE); `tables` reads and interpolates it with
numpy alone; `timing` times a step's operators from it. `python -m kvlab.kernel_tables extract`
regenerates the extract (needs the optional extra `measured`).

For a simulator: `kernels(model, hardware, weight_dtype, kv_dtype, tp).decode_step_s(batch,
mean_context)` is a cached, scalar, numpy-free path.
"""

from .tables import devices_with_data, load
from .timing import Kernels, StepTime, kernels

__all__ = ["Kernels", "StepTime", "devices_with_data", "kernels", "load"]
