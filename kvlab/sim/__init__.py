"""Discrete-event serving simulation: colocated, prefill/decode-disaggregated and KV-centric
(Mooncake-style) clusters replaying request traces, with step times from the ledger.

    simulate(trace, config=None, cost=None, **overrides) -> SimResult
    SimConfig    the cluster and its policies (frozen; sweep with dataclasses.replace)
    LedgerCost   step times from kvlab.cost (default); MeasuredCost for measured decode steps
    trace_slice  a window of a trace (start, duration, limit)
"""
from .cluster import Simulation, simulate
from .config import ARCH_DEFAULTS, ARCHS, DECODE_ROUTERS, PREFILL_ROUTERS, PREFIX_CACHES, SimConfig
from .costs import LedgerCost, MeasuredCost, pipeline_time_s
from .loop import EventLoop, SimulationError
from .results import RECORD_DTYPE, SUMMARY_KEYS, SimResult
from .workload import DONE, REJECTED, UNFINISHED, trace_slice

__all__ = ["Simulation", "simulate", "SimConfig", "ARCHS", "ARCH_DEFAULTS", "PREFIX_CACHES", "PREFILL_ROUTERS",
           "DECODE_ROUTERS", "LedgerCost", "MeasuredCost", "pipeline_time_s", "EventLoop", "SimulationError",
           "SimResult", "RECORD_DTYPE", "SUMMARY_KEYS", "trace_slice", "DONE", "REJECTED", "UNFINISHED"]
