"""Discrete-event serving simulation: colocated, prefill/decode-disaggregated and KV-centric
(Mooncake-style) clusters replaying request traces, with step times from the ledger.

    simulate(trace, config=None, cost=None, **overrides) -> SimResult
    SimConfig    the cluster and its policies (frozen; sweep with dataclasses.replace)
    SCHEDULERS   what a GPU runs per iteration (prefill-first, chunked, decode-first)
    LedgerCost   step times from kvlab.cost (default); KernelCost from measured kernel tables
                 (speed KernelTables()); BenchCost from a measured decode-step table
    trace_slice  a window of a trace (start, duration, limit) led in by a warm-up;
                 trace_at_rate / scale_arrivals: the same requests at a chosen load
    saturation   the highest request rate meeting an SLO attainment target, over seeds or
                 slices (bracket, then bisect), with its spread: DistServe's goodput
"""

from .cluster import Simulation, simulate
from .config import ARCH_DEFAULTS, ARCHS, PREFIX_CACHES, SimConfig, engine_chunk_tokens
from .cost_model import make_cost
from .costs import BenchCost, LedgerCost, pipeline_time_s
from .kernel_cost import KernelCost
from .loop import EventLoop, SimulationError
from .results import RECORD_DTYPE, SUMMARY_KEYS, SimResult
from .routers import DECODE_ROUTERS, PREFILL_ROUTERS
from .schedulers import PREEMPTION_MODES, SCHEDULERS
from .workload import (
    DONE,
    REJECTED,
    UNFINISHED,
    measured_rate_per_s,
    scale_arrivals,
    trace_at_rate,
    trace_slice,
)

__all__ = [
    "Simulation",
    "simulate",
    "SimConfig",
    "ARCHS",
    "ARCH_DEFAULTS",
    "PREFIX_CACHES",
    "PREFILL_ROUTERS",
    "DECODE_ROUTERS",
    "SCHEDULERS",
    "PREEMPTION_MODES",
    "engine_chunk_tokens",
    "LedgerCost",
    "BenchCost",
    "make_cost",
    "pipeline_time_s",
    "EventLoop",
    "SimulationError",
    "SimResult",
    "RECORD_DTYPE",
    "SUMMARY_KEYS",
    "trace_slice",
    "trace_at_rate",
    "scale_arrivals",
    "measured_rate_per_s",
    "KernelCost",
    "DONE",
    "REJECTED",
    "UNFINISHED",
]
