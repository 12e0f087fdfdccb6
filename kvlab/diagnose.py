"""The article's five-step diagnosis of a slow decode, as a function.

Given what was deployed (model, device, batch, context, dtypes) and what was measured
(tokens/s; optionally memory throughput, where the KV lives, the network), it says which
bound applies, how far the measurement is from the ceiling, whether weights or KV
dominate the bytes, and what to try, with the numbers behind every line. Every number
comes from kvlab.cost and kvlab.tiers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from . import cost, fmt
from .errors import check_number
from .hardware import get_device, get_tier
from .models import get_model

BANDWIDTH_BOUND_UTILISATION = 0.80  # the article: >= 80% of peak memory throughput
LOW_UTILISATION = 0.30  # ~30%: the time goes somewhere else (scheduling, waits, overheads)
CLOSE_TO_CEILING = 0.80  # measured >= 80% of the ceiling: stop tuning schedulers
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Finding:
    """One step of the diagnosis: what was checked, what it says, what to try."""

    step: int
    check: str
    verdict: str
    numbers: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Diagnosis:
    bound: str  # "memory bandwidth", "compute", "KV tier", "network" or "overheads"
    findings: list[Finding]

    def to_dict(self) -> dict:
        return {"bound": self.bound, "findings": [asdict(f) for f in self.findings]}

    def report(self) -> str:
        lines = [f"Diagnosis: {self.bound}-bound", ""]
        for f in self.findings:
            lines.append(f"{f.step}. {f.check}: {f.verdict}")
            lines += [f"   - {a}" for a in f.advice]
        return "\n".join(lines)


def diagnose(
    model,
    hardware,
    batch: int,
    context: int,
    measured_tokens_per_s: float,
    weight_dtype: str = "fp16",
    kv_dtype: str = "fp16",
    measured_bandwidth_bytes_per_s: float | None = None,
    kv_tier: str = "hbm",
    network_bandwidth_bytes_per_s: float | str | None = None,
    kv_bytes_per_request: float | None = None,
) -> Diagnosis:
    """Walk the five steps. `measured_tokens_per_s` is the aggregate over the batch.

    `measured_bandwidth_bytes_per_s`: the memory throughput a profiler reported (else it
    is inferred from tokens/s and the ledger's bytes per step). `kv_tier`: where the KV
    is really read from each step ('hbm', or a placement such as 'host-pcie5').
    `network_bandwidth_bytes_per_s` (bytes/s or a link name) and `kv_bytes_per_request`:
    for disaggregated serving, the KV each request sends between nodes.
    """
    from . import tiers

    m, dev = get_model(model), get_device(hardware)
    measured = check_number("measured tokens/s", measured_tokens_per_s, maximum=1e9)
    step = cost.decode_step(m, dev, batch, context, weight_dtype, kv_dtype)
    steps_per_s = measured / step.batch
    findings = []

    # 1. memory throughput utilisation
    achieved = (measured_bandwidth_bytes_per_s if measured_bandwidth_bytes_per_s is not None
                else steps_per_s * step.step_bytes)
    achieved = check_number("measured bandwidth (bytes/s)", achieved, maximum=cost.MAX_BANDWIDTH_BYTES_PER_S)
    utilisation = achieved / dev.memory_bandwidth_bytes_per_s
    source = "as measured" if measured_bandwidth_bytes_per_s is not None else "inferred from tokens/s x bytes per step"
    if step.bound == "compute":
        verdict = "the step is compute-bound at this batch: memory throughput is not the limit"
    elif utilisation >= BANDWIDTH_BOUND_UTILISATION:
        verdict = f"{fmt.percent(utilisation)} of peak memory bandwidth: bandwidth-bound"
    elif utilisation <= LOW_UTILISATION:
        verdict = (f"only {fmt.percent(utilisation)} of peak memory bandwidth: the time goes elsewhere "
                   "(scheduling, waiting, launch overheads, a slow KV tier)")
    else:
        verdict = f"{fmt.percent(utilisation)} of peak memory bandwidth: partly bandwidth-bound"
    findings.append(Finding(1, "memory throughput", verdict,
                            {"achieved_bytes_per_s": achieved, "peak_bytes_per_s": dev.memory_bandwidth_bytes_per_s,
                             "utilisation": utilisation, "source": source}))

    # 2. the ceiling
    ceiling = step.tokens_per_s
    fraction = measured / ceiling
    advice = []
    if fraction > 1.02:
        verdict = (f"{fmt.rate(measured)} tokens/s is above the {fmt.rate(ceiling)} tokens/s that the "
                   "hardware allows for these settings")
        advice.append("the settings do not describe what ran: check the dtypes (an fp8 or int4 model?), the "
                      "batch, the context and the device")
    elif fraction >= CLOSE_TO_CEILING:
        verdict = f"{fmt.rate(measured)} tokens/s is {fmt.percent(fraction)} of the {fmt.rate(ceiling)} ceiling"
        advice.append("stop tuning the scheduler: only fewer bytes per step (or a faster memory) will help")
    else:
        verdict = (f"{fmt.rate(measured)} tokens/s is {fmt.percent(fraction)} of the {fmt.rate(ceiling)} "
                   "ceiling: there is headroom before physics stops you")
        advice.append("look for stalls first: preemption, host overheads, small kernels, KV outside HBM")
    findings.append(Finding(2, "distance to the ceiling", verdict,
                            {"ceiling_tokens_per_s": ceiling, "fraction_of_ceiling": fraction,
                             "step_bytes": step.step_bytes, "step_time_s": step.step_time_s}, advice))

    # 3. weights or KV, and the batch knee
    kv_share = step.kv_read_bytes / step.step_bytes
    grid = np.array(BATCH_GRID, dtype=float)
    knee = float(grid[cost.batch_knee(cost.decode_step(m, dev, grid, context, weight_dtype, kv_dtype))])
    advice = []
    if kv_share < 0.5:
        verdict = f"weights are {fmt.percent(1 - kv_share)} of the bytes"
        if weight_dtype not in ("int4",):
            q = cost.decode_step(m, dev, batch, context, "int4", kv_dtype)
            advice.append(f"quantize the weights to int4: ceiling {fmt.rate(q.tokens_per_s)} tokens/s "
                          f"({fmt.sig(q.tokens_per_s / ceiling, 3)}x)")
    else:
        verdict = f"the KV history is {fmt.percent(kv_share)} of the bytes"
        if kv_dtype not in ("fp8", "int8", "int4"):
            q = cost.decode_step(m, dev, batch, context, weight_dtype, "fp8")
            advice.append(f"quantize the KV cache to fp8: ceiling {fmt.rate(q.tokens_per_s)} tokens/s "
                          f"({fmt.sig(q.tokens_per_s / ceiling, 3)}x)")
    if batch < knee and step.bound == "memory":
        at_knee = cost.decode_step(m, dev, knee, context, weight_dtype, kv_dtype)
        fits = "fits" if at_knee.fits else "does not fit in memory"
        advice.append(f"raise the batch towards the knee at {fmt.fixed(knee, 0)}: {fmt.rate(at_knee.tokens_per_s)} "
                      f"tokens/s at a TPOT of {fmt.seconds(at_knee.step_time_s)} ({fits})")
    elif batch > knee:
        advice.append(f"the batch is past the knee ({fmt.fixed(knee, 0)}): more sequences mostly add KV traffic "
                      "and TPOT; watch the tail")
    findings.append(Finding(3, "weights or KV", verdict,
                            {"weight_bytes": step.weight_read_bytes, "kv_read_bytes": step.kv_read_bytes,
                             "kv_share": kv_share, "knee_batch": knee}, advice))

    # 4. where the KV really lives
    bound = "compute" if step.bound == "compute" else "memory bandwidth"
    if kv_tier.lower() == tiers.HBM:
        findings.append(Finding(4, "KV storage tier", "the KV is read from HBM", {"tier": tiers.HBM}))
    else:
        t = tiers.tiered_decode_step(m, dev, batch, context, kv_tier, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
        verdict = (f"KV read every step from {t.placement}: {fmt.rate(t.tokens_per_s)} tokens/s against "
                   f"{fmt.rate(t.hbm_tokens_per_s)} with the KV in HBM ({fmt.sig(t.slowdown, 3)}x slower)")
        findings.append(Finding(4, "KV storage tier", verdict,
                                {"tier": t.placement, "tier_bytes": t.tier_bytes, "tokens_per_s": t.tokens_per_s,
                                 "hbm_tokens_per_s": t.hbm_tokens_per_s, "slowdown": t.slowdown},
                                ["move the KV into HBM before decode (one transfer), prefetch the next "
                                 "batch's KV while computing, and count hits by the tier that served them"]))
        if t.bound == "tier":
            bound = "KV tier"

    # 5. the network
    if network_bandwidth_bytes_per_s is not None and kv_bytes_per_request is not None:
        link = network_bandwidth_bytes_per_s
        bandwidth = get_tier(link).bandwidth_bytes_per_s if isinstance(link, str) else check_number(
            "network bandwidth (bytes/s)", link, maximum=cost.MAX_BANDWIDTH_BYTES_PER_S)
        moved = check_number("KV bytes per request", kv_bytes_per_request, maximum=1e15)
        transfer = tiers.transfer_time_s(moved, bandwidth)
        per_step = transfer / step.step_time_s
        verdict = (f"{fmt.si(moved, 'B')} per request takes {fmt.seconds(transfer)} over the network, "
                   f"{fmt.sig(per_step, 3)} decode steps' worth")
        advice = ["overlap the transfer with prefill layer by layer so it leaves the critical path",
                  "never read KV over the network every step: pull it into the decode node's HBM once"]
        findings.append(Finding(5, "network", verdict,
                                {"transfer_s": transfer, "network_bytes_per_s": bandwidth,
                                 "transfer_in_decode_steps": per_step}, advice))
        if per_step > 1 and bound == "memory bandwidth" and utilisation < LOW_UTILISATION:
            bound = "network"
    else:
        findings.append(Finding(5, "network", "not checked (give the network bandwidth and KV bytes per request)"))
    if bound == "memory bandwidth" and utilisation <= LOW_UTILISATION:
        bound = "overheads"
    return Diagnosis(bound, findings)
