"""What a simulation returns: per-request records, token timestamps, link and cache ledgers."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .. import metrics
from .config import SimConfig
from .loop import SimulationError
from .workload import DONE, REJECTED, STATUS, UNFINISHED

SIM_DTYPE = np.dtype(
    [
        ("request", "i8"),
        ("status", "i1"),
        ("input_tokens", "i8"),
        ("output_tokens", "i8"),
        ("cached_tokens", "i8"),
        ("prefill_worker", "i4"),
        ("decode_worker", "i4"),
        ("prefill_start_s", "f8"),
        ("prefill_end_s", "f8"),
        ("decode_start_s", "f8"),
        ("queue_s", "f8"),
        ("fetch_s", "f8"),
        ("fetch_exposed_s", "f8"),
        ("transfer_bytes", "f8"),
        ("transfer_wire_s", "f8"),
        ("transfer_exposed_s", "f8"),
        ("decode_wait_s", "f8"),
        ("preemptions", "i4"),
        ("swapped_bytes", "f8"),
        ("measured", "?"),  # False for the lead-in (warm-up) requests
    ]
)
RECORD_DTYPE = np.dtype(SIM_DTYPE.descr + [d for d in metrics.REQUEST_DTYPE.descr])

#: What `scheduler` and `chunk_tokens` act on, colocated (True) or not.
SCHEDULER_SCOPE = {True: "every GPU", False: "decode GPUs' recomputes of preempted sequences"}

#: JSON keys `kvlab simulate --json` always prints (a contract, see kvlab/cli/simulate.py).
SUMMARY_KEYS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "itl_p99_s",
    "throughput_tokens_per_s",
    "requests_completed",
    "prefix_hit_ratio",
)


@dataclass(frozen=True)
class SimResult:
    """One run. `records` is a structured array (one row per request, see RECORD_DTYPE);
    request i's token timestamps are token_times_s[token_offsets[i]:token_offsets[i+1]]."""

    config: SimConfig
    trace: str  # the trace's label ("... (generated)" for generated data)
    generated: bool
    records: np.ndarray = dataclasses.field(repr=False)
    token_times_s: np.ndarray = dataclasses.field(repr=False)
    token_offsets: np.ndarray = dataclasses.field(repr=False)
    network: dict = dataclasses.field(repr=False)
    cache: dict = dataclasses.field(repr=False)
    workers: tuple = dataclasses.field(repr=False)
    timeline: tuple = dataclasses.field(repr=False)  # (worker, start_s, end_s, kind, request)
    rejected: tuple  # (request, reason, kind): kind "too-long", "too-large" or "early"
    events: int
    sim_end_s: float
    wall_s: float  # machine time of the run: not in summary() (results compare byte for byte)
    #: where step times came from: {"source", "steps_priced", "steps_priced_outside_tables"}
    step_costs: dict = dataclasses.field(default_factory=dict, repr=False)

    def tokens(self, i: int) -> np.ndarray:
        """Token timestamps of request i (seconds from the slice start)."""
        return self.token_times_s[self.token_offsets[i] : self.token_offsets[i + 1]]

    @property
    def done(self) -> np.ndarray:
        return self.records["status"] == DONE

    @property
    def measured(self) -> np.ndarray:
        """Requests measured: all but the lead-in (warm-up) ones."""
        return self.records["measured"]

    @property
    def prefix_hit_ratio(self) -> float:
        """Prompt tokens served by the prefix cache / prompt tokens, over prefilled measured
        requests."""
        rec = self.records[self.measured]
        started = ~np.isnan(rec["prefill_start_s"])
        total = rec["input_tokens"][started].sum()
        return float(rec["cached_tokens"][started].sum() / total) if total else 0.0

    def _measured_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(flat token timestamps, offsets) of the measured requests only."""
        m = self.measured
        if m.all():
            return self.token_times_s, self.token_offsets
        lengths = np.diff(self.token_offsets)
        offsets = np.zeros(int(m.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[m], out=offsets[1:])
        return self.token_times_s[np.repeat(m, lengths)], offsets

    def summary(self, ttft_slo_s=None, tbt_slo_s=None, tbt_stat: str | None = None) -> dict:
        """Headline figures (JSON-ready): latency percentiles, throughput, SLOs, hits, bytes,
        preemptions. The SLOs default to the config's. Request figures are over the measured
        requests (a warm-up's lead-in is left out); the network and cache ledgers and the
        GPUs' busy shares cover the whole replay."""
        c = self.config
        ttft_slo_s = c.ttft_slo_s if ttft_slo_s is None else ttft_slo_s
        tbt_slo_s = c.tbt_slo_s if tbt_slo_s is None else tbt_slo_s
        tbt_stat = c.tbt_stat if tbt_stat is None else tbt_stat
        measured = self.measured
        r = self.records[measured]
        done = r["status"] == DONE
        flat, offsets = self._measured_tokens()
        out = {
            "arch": c.arch,
            "trace": self.trace,
            "generated": self.generated,
            "model": c.model,
            "hardware": c.hardware,
            "link": c.link,
            "prefill_workers": c.prefill_workers,
            "decode_workers": c.decode_workers,
            "gpus": c.gpus,
            "prefix_cache": c.prefix_cache,
            "overlap": c.overlap,
            "remote_kv": c.remote_kv,
            "scheduler": c.scheduler,
            "chunk_tokens": c.chunk_tokens,
            # prefill GPUs run one prompt at a time, first come first served: apart from a
            # colocated cluster, the scheduler and its budget only order what a decode GPU
            # prefills again (sequences it preempted to recompute)
            "scheduler_scope": SCHEDULER_SCOPE[c.arch == "colocated"],
            "preemption": c.preemption,
            "early_reject": c.early_reject,
            "efficiency": c.efficiency.label,
        }
        costs = self.step_costs
        out["efficiency_source"] = costs.get("source")
        out["steps_priced"] = costs.get("steps_priced", 0)
        out["steps_priced_outside_tables"] = costs.get("steps_priced_outside_tables", 0)
        # SLO shares are over all requests: a rejected request missed its SLO
        out.update(
            metrics.summarize(
                r["arrival_s"],
                flat,
                offsets,
                ttft_slo_s=ttft_slo_s,
                tbt_slo_s=tbt_slo_s,
                tbt_stat=tbt_stat,
                records=_metric_view(r),
                duration_s=self._duration_s(),
                scheduling_delay_s=r["queue_s"],
                scheduling_delay_slo_s=c.scheduling_delay_slo_s,
            )
        )
        out["requests"] = int(r.size)
        out["requests_warmup"] = int((~measured).sum())
        out["requests_completed"] = int(done.sum())
        out["requests_rejected"] = int((r["status"] == REJECTED).sum())
        kinds = [kind for i, _, kind in self.rejected if measured[i]]
        out["requests_rejected_early"] = kinds.count("early")
        out["requests_rejected_too_large"] = kinds.count("too-large")
        out["requests_rejected_too_long"] = kinds.count("too-long")
        out["itl_max_s"] = (
            float(np.nanmax(r["itl_max_s"][done])) if (done & (r["tokens"] > 1)).any() else None
        )
        out["preemptions"] = int(r["preemptions"].sum())
        out["requests_preempted"] = int((r["preemptions"] > 0).sum())
        out["swapped_bytes"] = float(r["swapped_bytes"].sum())
        out["requests_unfinished"] = int((r["status"] == UNFINISHED).sum())
        out["prefix_hit_ratio"] = self.prefix_hit_ratio
        out["prefix_block_hit_ratio"] = self.cache.get("block_hit_ratio", 0.0)
        out.update(metrics.percentiles(r["queue_s"][done], prefix="queue_"))
        out["mean_decode_wait_s"] = float(r["decode_wait_s"][done].mean()) if done.any() else None
        out["mean_transfer_exposed_s"] = (
            float(r["transfer_exposed_s"][done].mean()) if done.any() else None
        )
        out["bytes_by_link"] = self.network["by_link"]
        out["bytes_moved"] = float(sum(self.network["by_link"].values()))
        out["move_wire_s"] = float(sum(v["wire_s"] for v in self.network["by_purpose"].values()))
        out["move_exposed_s"] = self.network["exposed_s"]
        out["move_hidden_s"] = self.network["hidden_s"]
        out["move_delay_s"] = self.network["delay_s"]
        out["gpu_busy_share"] = {w["name"]: w["busy_share"] for w in self.workers}
        out["sim_end_s"] = self.sim_end_s
        out["events"] = self.events
        return _json_ready(out)

    def _duration_s(self) -> float:
        """First measured arrival to the last measured token."""
        rec = self.records[self.measured]
        done = rec[rec["status"] == DONE]
        if not done.size:
            return 0.0
        return float(np.max(done["finish_s"]) - np.min(rec["arrival_s"]))

    def records_table(self) -> list[dict]:
        """Per-request records as plain dicts, status as a word."""
        rows = metrics.records_table(self.records)
        for row in rows:
            row["status"] = STATUS[row["status"]]
        return rows

    def to_dict(self, ttft_slo_s=None, tbt_slo_s=None, tbt_stat: str | None = None) -> dict:
        """Summary + config + network and cache ledgers + rejections (no per-token data)."""
        out = self.summary(ttft_slo_s, tbt_slo_s, tbt_stat)
        out["config"] = self.config.to_dict()
        out["network"] = self.network
        out["cache"] = self.cache
        out["workers"] = list(self.workers)
        out["rejected"] = [
            {"request": i, "reason": why, "kind": kind} for i, why, kind in self.rejected
        ]
        return _json_ready(out)


def _metric_view(records: np.ndarray) -> np.ndarray:
    """The metrics columns of records, as a kvlab.metrics request array."""
    out = np.zeros(records.size, dtype=metrics.REQUEST_DTYPE)
    for name in metrics.REQUEST_DTYPE.names:
        out[name] = records[name]
    return out


def _json_ready(x):
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, np.ndarray):
        return _json_ready(x.tolist())
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _check_invariants(sim) -> None:
    """What must hold after every run; a failure is a simulator bug, never bad input."""

    ended = sum(q.status != UNFINISHED for q in sim.requests)
    if sim.finished != ended:
        raise SimulationError(f"{sim.finished} request endings counted for {ended} ended requests")
    if sim.pending:
        raise SimulationError(f"{len(sim.pending)} prefilled requests never found a decode GPU")
    if len(sim.loop):
        raise SimulationError(f"{len(sim.loop)} events left after the run")
    for w in sim.decoders:
        left = (
            w.slots,
            w.other_blocks,
            len(w.running),
            len(w.incoming),
            len(w.prefilling),
            len(w.waiting),
            len(w.swapped),
        )
        if any(left):
            raise SimulationError(
                f"{w.name} still holds (slots, blocks, running, incoming, prefilling, waiting, "
                f"swapped) = {left} at the end"
            )
    for q in sim.requests:
        if q.status == DONE and q.produced != q.output_tokens:
            raise SimulationError(f"request {q.id} made {q.produced} tokens for {q.output_tokens}")


def _token_times(reqs) -> tuple[np.ndarray, np.ndarray]:
    arrays = [q.tokens_s() if q.status == DONE else np.zeros(0) for q in reqs]
    return metrics.token_csr(arrays)


def _workers(sim, span_s: float) -> list[dict]:
    out, seen = [], set()
    for w in (*sim.front, *sim.decoders):
        if id(w) in seen:
            continue
        seen.add(id(w))
        out.append(
            {
                "name": w.name,
                "role": w.role,
                "busy_s": w.busy_s,
                "busy_share": w.busy_s / span_s,
                "steps": getattr(w, "n", None),
                "preemptions": getattr(w, "preemptions", 0),
            }
        )
    return out


def build_result(sim, wall_s: float) -> SimResult:
    """Collect a finished Simulation into a SimResult."""
    reqs = sim.requests
    n = len(reqs)
    _check_invariants(sim)
    flat, offsets = _token_times(reqs)
    arrival = np.fromiter((q.arrival_s for q in reqs), float, n)
    per = metrics.request_metrics(arrival, flat, offsets)
    rec = np.zeros(n, dtype=RECORD_DTYPE)
    for name in metrics.REQUEST_DTYPE.names:
        rec[name] = per[name]
    cols = (
        "id",
        "status",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "prefill_worker",
        "decode_worker",
        "prefill_start_s",
        "prefill_end_s",
        "decode_start_s",
        "fetch_s",
        "fetch_exposed_s",
        "transfer_bytes",
        "transfer_wire_s",
        "transfer_exposed_s",
        "decode_wait_s",
        "preemptions",
        "swapped_bytes",
    )
    for col in cols:
        rec["request" if col == "id" else col] = [getattr(q, col) for q in reqs]
    rec["queue_s"] = rec["prefill_start_s"] - rec["arrival_s"]
    rec["measured"] = np.arange(n) >= sim.trace.lead_in
    moved = (
        (rec["decode_worker"] >= 0) & (sim.config.arch != "colocated") & (not sim.config.remote_kv)
    )
    rec["transfer_bytes"][~moved] = 0.0  # bytes that actually crossed to a decode GPU
    end = sim.loop.now
    span = max(end - (arrival.min() if n else 0.0), 1e-12)
    rejected = tuple((q.id, q.reason, q.reject_kind) for q in reqs if q.status == REJECTED)
    return SimResult(
        config=sim.config,
        trace=sim.trace.label,
        generated=sim.trace.generated,
        records=rec,
        token_times_s=flat,
        token_offsets=offsets,
        network=sim.network.summary(),
        cache=sim.caches.stats(),
        workers=tuple(_workers(sim, span)),
        timeline=tuple(sorted(sim.timeline, key=lambda row: (row[1], row[0]))),
        rejected=rejected,
        events=sim.loop.events,
        sim_end_s=end,
        wall_s=wall_s,
        step_costs=_step_costs(sim),
    )


def _step_costs(sim) -> dict:
    """Where this run's step times came from, and how many were priced beyond measured data
    (the cost object's counters, read as differences: sweeps share one cost object)."""
    counts = getattr(sim.cost, "counts", None)
    priced, outside = counts() if counts else (0, 0)
    start_priced, start_outside = sim.cost_counts_start
    return {
        "source": getattr(sim.cost, "source", type(sim.cost).__name__),
        "steps_priced": priced - start_priced,
        "steps_priced_outside_tables": outside - start_outside,
    }
