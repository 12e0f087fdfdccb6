"""The article's five-step diagnosis of a slow decode, as a function.

Given what was deployed (model, device, batch, context, dtypes) and what was measured
(tokens/s; optionally memory throughput, where the KV lives, the network), it says which
bound applies, how far the measurement is from the ceiling, whether weights or KV
dominate the bytes, and what to try, with the numbers behind every line. Every number
comes from kvlab.cost and kvlab.tiers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from . import cost, fmt, tiers
from .deployment import Deployment
from .dtypes import bytes_per_element
from .errors import KvlabError, check_number
from .hardware import USABLE_MEMORY_FRACTION, Device, devices, get_device, get_tier
from .jsonsafe import jsonable
from .models import ModelSpec, get_model

BANDWIDTH_BOUND_UTILISATION = 0.80  # the article: >= 80% of peak memory throughput
LOW_UTILISATION = 0.30  # ~30%: the time goes somewhere else (scheduling, waits, overheads)
CLOSE_TO_CEILING = 0.80  # measured >= 80% of the ceiling: stop tuning schedulers
#: Inferred from tokens/s, a throughput above the peak by more than this is no measurement.
IMPOSSIBLE_SHARE = 1.02
#: With a profiler's bandwidth: kernels stream at >= BANDWIDTH_BOUND_UTILISATION while they
#: run, yet the wall clock moves less than this share of it: the rest is gaps between kernels.
BUSY_SHARE_FOR_GAPS = 0.70
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Weight dtypes the fit advice tries, widest first (each only where narrower than the model's).
NARROWER_WEIGHTS = ("int8", "int4")
#: Tensor-parallel degrees of one server the fit advice tries.
TP_DEGREES = (2, 4, 8)


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
    # "memory bandwidth", "compute", "KV tier", "network", "overheads", "launch and host
    # overheads" or "memory capacity"
    bound: str
    findings: list[Finding]
    fit: Finding | None = None  # step 0, memory fit: always computed, reported first when it fails

    @property
    def fits(self) -> bool:
        return self.fit is None or bool(self.fit.numbers["fits"])

    def to_dict(self) -> dict:
        out = {
            "bound": self.bound,
            "fits": self.fits,
            "findings": [jsonable(asdict(f)) for f in self.findings],
        }
        if self.fit is not None:
            out["fit"] = jsonable(asdict(self.fit))
        return out

    def report(self) -> str:
        lines = [f"Diagnosis: {self.bound}-bound", ""]
        shown = self.findings if self.fits else [self.fit, *self.findings]
        for f in shown:
            lines.append(f"{f.step}. {f.check}: {f.verdict}")
            lines += [f"   - {a}" for a in f.advice]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Inputs:
    """What was deployed and measured. `_checked` resolves the names and checks every value
    before any step runs (a value that a step would not use is checked too: a typo is never
    silently ignored); the steps see only checked inputs."""

    model: ModelSpec | str
    device: Device | str
    batch: int
    context: int
    measured_tokens_per_s: float
    weight_dtype: str
    kv_dtype: str
    measured_bandwidth_bytes_per_s: float | None
    kv_tier: str
    network_bytes_per_s: float | str | None  # bytes/s, or a link's name until checked
    kv_bytes_per_request: float | None


def _bandwidth(name: str, value) -> float:
    return check_number(
        name,
        value,
        minimum=cost.MIN_BANDWIDTH_BYTES_PER_S,
        allow_equal_min=True,
        maximum=cost.MAX_BANDWIDTH_BYTES_PER_S,
    )


def _checked(given: _Inputs) -> _Inputs:
    """`given` (the model and device still as named, the network as a link name or bytes/s)
    with names resolved and every value checked."""
    m, dev = get_model(given.model), get_device(given.device)
    measured = check_number("measured tokens/s", given.measured_tokens_per_s, maximum=1e9)
    measured_bandwidth = given.measured_bandwidth_bytes_per_s
    if measured_bandwidth is not None:
        measured_bandwidth = _bandwidth("measured bandwidth (bytes/s)", measured_bandwidth)
    kv_tier = given.kv_tier
    if not isinstance(kv_tier, str):
        raise KvlabError(
            f"kv_tier must be a placement name such as hbm or host-pcie5, got {kv_tier!r}"
        )
    if kv_tier.lower() != tiers.HBM:
        tiers.get_placement(kv_tier)
    network, bandwidth = given.network_bytes_per_s, None
    if isinstance(network, str):
        bandwidth = get_tier(network).bandwidth_bytes_per_s
    elif network is not None:
        bandwidth = _bandwidth("network bandwidth (bytes/s)", network)
    kv_bytes_per_request = given.kv_bytes_per_request
    if kv_bytes_per_request is not None:
        kv_bytes_per_request = check_number(
            "KV bytes per request", kv_bytes_per_request, maximum=1e15
        )
    if (bandwidth is None) != (kv_bytes_per_request is None):
        raise KvlabError(
            "the network check needs both the network bandwidth and the KV bytes "
            "each request sends (--network and --kv-bytes-per-request); give both "
            "or neither"
        )
    return replace(
        given,
        model=m,
        device=dev,
        measured_tokens_per_s=measured,
        measured_bandwidth_bytes_per_s=measured_bandwidth,
        network_bytes_per_s=bandwidth,
        kv_bytes_per_request=kv_bytes_per_request,
    )


def diagnose(  # noqa: PLR0913 - one keyword per `kvlab diagnose` option
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
    for disaggregated serving, the KV each request sends between nodes (give both or
    neither). A deployment that does not fit in memory is said so first (step 0), and
    its bound is "memory capacity".
    """
    d = _checked(
        _Inputs(
            model,
            hardware,
            batch,
            context,
            measured_tokens_per_s,
            weight_dtype,
            kv_dtype,
            measured_bandwidth_bytes_per_s,
            kv_tier,
            network_bandwidth_bytes_per_s,
            kv_bytes_per_request,
        )
    )
    step = cost.decode_step(_deployment(d), d.batch, d.context)
    fit = _memory_fit(d, step)
    throughput = _memory_throughput(d, step)
    tier, tier_bound, tiered = _kv_tier(d)
    findings = [
        throughput,
        _ceiling(d, step, tiered),
        _weights_or_kv(d, step, tiered),
        tier,
        _network(d, step),
    ]
    bound = _bound(step, throughput, tier_bound, findings[4])
    return Diagnosis("memory capacity" if not fit.numbers["fits"] else bound, findings, fit)


def _deployment(d: _Inputs, **changes) -> Deployment:
    """The deployment being diagnosed (with `changes`: the advice's alternatives)."""
    values = dict(weight_dtype=d.weight_dtype, kv_dtype=d.kv_dtype) | changes
    return Deployment(d.model, d.device, values["weight_dtype"], values["kv_dtype"])


def _memory_fit(d: _Inputs, step) -> Finding:
    """0. Weights plus every sequence's KV against the device's memory."""
    numbers = {
        "fits": bool(step.fits),
        "needed_bytes": step.memory_needed_bytes,
        "capacity_bytes": step.capacity_bytes,
        "weight_bytes": step.weight_bytes,
        "kv_cache_bytes": step.kv_cache_bytes,
        "max_batch": int(step.max_batch),
    }
    needed, capacity = fmt.si(step.memory_needed_bytes, "B"), fmt.si(step.capacity_bytes, "B")
    if step.fits:
        return Finding(0, "memory fit", f"{needed} of {capacity}: fits", numbers)
    verdict = (
        f"does NOT fit: {needed} needed (weights {fmt.si(step.weight_bytes, 'B')}, KV "
        f"{fmt.si(step.kv_cache_bytes, 'B')}), the {d.device.name} gives weights + KV "
        f"{capacity} ({fmt.percent(USABLE_MEMORY_FRACTION, 2)} of "
        f"{fmt.si(d.device.capacity_bytes, 'B')}); this "
        "deployment cannot run as described, so the steps below say what it would do if "
        "it could"
    )
    if step.weight_bytes >= step.capacity_bytes:
        advice = _weights_do_not_fit(d, step)
    else:
        advice = [
            f"at a context of {fmt.fixed(d.context, 0)} tokens at most "
            f"{fmt.fixed(step.max_batch, 0)} sequences fit beside the weights: lower the "
            "batch or the context, or quantize the KV cache"
        ]
    return Finding(0, "memory fit", verdict, numbers, advice)


def _weights_do_not_fit(d: _Inputs, step) -> list[str]:
    """Advice when the weights alone exceed the memory: only what fits. The narrowest weight
    dtype (int8, then int4) with which weights + KV fit on this device; else that nothing
    fits on one, and what would: tensor parallelism over a server's GPUs, or a device of the
    catalogue that holds it as it is."""
    usable = fmt.si(step.capacity_bytes, "B")
    width = bytes_per_element(d.weight_dtype)
    tried = [w for w in NARROWER_WEIGHTS if bytes_per_element(w) < width]
    for w in tried:
        q = cost.decode_step(_deployment(d, weight_dtype=w), d.batch, d.context)
        if q.fits:
            needed = fmt.si(q.memory_needed_bytes, "B")
            return [
                f"the weights alone exceed the memory: quantized to {w} they take "
                f"{fmt.si(q.weight_bytes, 'B')}, and with the KV {needed} of the {usable}: "
                "that fits"
            ]
    narrowest = tried[-1] if tried else d.weight_dtype
    q = cost.decode_step(_deployment(d, weight_dtype=narrowest), d.batch, d.context)
    advice = [
        f"nothing fits on one {d.device.name}: even with {narrowest} weights "
        f"({fmt.si(q.weight_bytes, 'B')}) weights + KV need {fmt.si(q.memory_needed_bytes, 'B')} "
        f"of the {usable}"
    ]
    tp = None
    for n in TP_DEGREES:
        try:
            split = cost.decode_step(_deployment(d).replace(tensor_parallel=n), d.batch, d.context)
        except KvlabError:  # e.g. K/V heads that do not split n ways
            continue
        if split.fits:
            tp = (n, split)
            break
    if tp is not None:
        n, split = tp
        advice.append(
            f"split the model over {n} {d.device.name} GPUs with tensor parallelism: each holds "
            f"{fmt.si(split.memory_needed_bytes, 'B')} of its {usable}"
        )
    else:
        advice.append(
            f"not even {TP_DEGREES[-1]} {d.device.name} GPUs of one server hold it as "
            "described: quantize the weights and split them, or add pipeline parallelism "
            "across servers"
        )
    bigger = [
        dev.name
        for dev in sorted(devices().values(), key=lambda x: x.capacity_bytes)
        if dev.name != d.device.name
        and cost.decode_step(_deployment(d).replace(hardware=dev), d.batch, d.context).fits
    ]
    if bigger:
        advice.append(
            "or one device with more memory holds it as described: "
            f"{', '.join(bigger)} (kvlab hardware)"
        )
    if step.kv_cache_bytes >= step.capacity_bytes:
        advice.append(
            f"the KV alone ({fmt.si(step.kv_cache_bytes, 'B')}) exceeds the memory: lower "
            "the batch or the context, or quantize the KV cache"
        )
    return advice


def _memory_throughput(d: _Inputs, step) -> Finding:
    """1. Memory throughput utilisation: a profiler's figure (kernels only) if given, else
    the wall-clock figure tokens/s x bytes per step (which is step 2's fraction again)."""
    steps_per_s = d.measured_tokens_per_s / step.batch
    wall = steps_per_s * step.step_bytes  # what the tokens/s imply; step 2 judges it
    peak = d.device.memory_bandwidth_bytes_per_s
    measured = d.measured_bandwidth_bytes_per_s
    achieved = measured if measured is not None else wall
    utilisation = achieved / peak
    numbers = {
        "achieved_bytes_per_s": achieved,
        "peak_bytes_per_s": peak,
        "utilisation": utilisation,
        "wall_clock_bytes_per_s": wall,
        "source": "as measured (a profiler)"
        if measured is not None
        else "inferred from tokens/s x bytes per step",
    }
    advice = []
    if measured is None:
        advice.append(
            "inferred from tokens/s, this repeats step 2: a profiler's memory throughput "
            "(Nsight Compute dram__throughput) tells slow kernels from gaps between them"
        )
    busy = min(wall / achieved, 1.0) if measured is not None else 1.0
    numbers["busy_share"] = busy
    if measured is None and wall > peak * IMPOSSIBLE_SHARE:
        verdict = (
            f"{fmt.rate(d.measured_tokens_per_s)} tokens/s would move {fmt.si(wall, 'B/s')}, "
            f"{fmt.sig(wall / peak, 3)}x the {d.device.name}'s peak memory bandwidth: the "
            "settings do not describe what ran (see step 2)"
        )
        advice = []
    elif step.bound == "compute":
        verdict = "the step is compute-bound at this batch: memory throughput is not the limit"
    elif utilisation >= BANDWIDTH_BOUND_UTILISATION and busy < BUSY_SHARE_FOR_GAPS:
        verdict = (
            f"kernels stream at {fmt.percent(utilisation)} of peak bandwidth while they run, but "
            f"the wall clock moves only {fmt.percent(wall / peak)}: about {fmt.percent(1 - busy)} "
            "of each step no kernel is reading memory"
        )
        advice.append(
            "the gaps are launches and host work (scheduling, sampling, Python): capture the "
            "step in a CUDA graph, overlap the scheduler with the GPU, fuse small kernels"
        )
    elif utilisation >= BANDWIDTH_BOUND_UTILISATION:
        verdict = f"{fmt.percent(utilisation)} of peak memory bandwidth: bandwidth-bound"
    elif utilisation <= LOW_UTILISATION:
        verdict = (
            f"only {fmt.percent(utilisation)} of peak memory bandwidth: the time goes "
            "elsewhere (scheduling, waiting, launch overheads, a slow KV tier)"
        )
    else:
        verdict = f"{fmt.percent(utilisation)} of peak memory bandwidth: partly bandwidth-bound"
    return Finding(1, "memory throughput", verdict, numbers, advice)


def _ceiling(d: _Inputs, step, tiered) -> Finding:
    """2. The distance to the ceiling the ledger allows (with the KV read from its real
    tier when step 4 says it is not in HBM)."""
    measured = d.measured_tokens_per_s
    ceiling = step.tokens_per_s if tiered is None else tiered.tokens_per_s
    fraction = measured / ceiling
    rate, limit = fmt.rate(measured), fmt.rate(ceiling)
    if tiered is not None:
        limit = f"{limit} (KV read from {tiered.placement})"
    if fraction > 1.02:
        verdict = (
            f"{rate} tokens/s is above the {limit} tokens/s that the hardware allows for "
            "these settings"
        )
        advice = [
            "the settings do not describe what ran: check the dtypes (an fp8 or int4 "
            "model?), the batch, the context and the device"
        ]
    elif fraction >= CLOSE_TO_CEILING:
        verdict = f"{rate} tokens/s is {fmt.percent(fraction)} of the {limit} ceiling"
        advice = [
            "stop tuning the scheduler: only fewer bytes per step (or a faster memory) will help"
        ]
    else:
        verdict = (
            f"{rate} tokens/s is {fmt.percent(fraction)} of the {limit} ceiling: there "
            "is headroom before physics stops you"
        )
        advice = [
            "look for stalls first: preemption, host overheads, small kernels, KV outside HBM"
        ]
    return Finding(
        2,
        "distance to the ceiling",
        verdict,
        {
            "ceiling_tokens_per_s": ceiling,
            "fraction_of_ceiling": fraction,
            "hbm_ceiling_tokens_per_s": step.tokens_per_s,
            "step_bytes": step.step_bytes,
            "step_time_s": step.step_time_s,
        },
        advice,
    )


def _weights_or_kv(d: _Inputs, step, tiered=None) -> Finding:
    """3. Whether weights or KV dominate the step, and where the batch knee is. With the KV
    read from another tier every step (step 4), what dominates is the time, not the bytes, and
    every ceiling advised is the one at that tier: quantizing KV that crosses PCIe helps at
    PCIe's speed, not HBM's."""
    ceiling = step.tokens_per_s if tiered is None else tiered.tokens_per_s
    kv_share = step.kv_read_bytes / step.step_bytes
    numbers = {
        "weight_bytes": step.weight_read_bytes,
        "kv_read_bytes": step.kv_read_bytes,
        "kv_share": kv_share,
    }
    if tiered is None:
        kv_dominates = kv_share >= 0.5
    else:
        tier_s, hbm_s = float(tiered.tier_time_s), float(tiered.hbm_time_s)
        numbers["kv_time_share"] = kv_time = tier_s / (tier_s + hbm_s)
        kv_dominates = kv_time >= 0.5

    def quantized(weight_dtype: str, kv_dtype: str):
        """(ceiling tokens/s, fits) with other dtypes, at the tier the KV is read from."""
        other = _deployment(d, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
        q = cost.decode_step(other, d.batch, d.context)
        if tiered is None:
            return q.tokens_per_s, bool(q.fits)
        t = tiers.tiered_decode_step(other, d.batch, d.context, d.kv_tier)
        return t.tokens_per_s, bool(q.weight_bytes <= q.capacity_bytes)  # the KV is elsewhere

    where = "" if tiered is None else f" with the KV still read from {tiered.placement}"
    advice = []
    if not kv_dominates:
        verdict = f"weights are {fmt.percent(1 - kv_share)} of the bytes"
        if d.weight_dtype not in ("int4",):
            rate, fits = quantized("int4", d.kv_dtype)
            if fits:  # only what fits: the memory fit (step 0) says what to do otherwise
                advice.append(
                    f"quantize the weights to int4: ceiling {fmt.rate(rate)} tokens/s{where} "
                    f"({fmt.sig(rate / ceiling, 3)}x)"
                )
    else:
        verdict = f"the KV history is {fmt.percent(kv_share)} of the bytes"
        if tiered is not None:
            verdict += (
                f" and, read from {tiered.placement}, {fmt.percent(numbers['kv_time_share'])} "
                "of the step's time"
            )
        if d.kv_dtype not in ("fp8", "int8", "int4"):
            rate, fits = quantized(d.weight_dtype, "fp8")
            if fits:
                advice.append(
                    f"quantize the KV cache to fp8: ceiling {fmt.rate(rate)} tokens/s{where} "
                    f"({fmt.sig(rate / ceiling, 3)}x)"
                )
    grid = cost.decode_step(_deployment(d), np.array(BATCH_GRID, dtype=float), d.context)
    knee = float(BATCH_GRID[cost.batch_knee(grid)])
    numbers["knee_batch"] = knee
    if tiered is not None:
        advice += _tier_batch_advice(d, tiered, numbers)
    elif d.batch < knee and step.bound == "memory":
        at_knee = cost.decode_step(_deployment(d), knee, d.context)
        most = int(step.max_batch)
        if at_knee.fits:
            advice.append(
                f"raise the batch towards the knee at {fmt.fixed(knee, 0)}: "
                f"{fmt.rate(at_knee.tokens_per_s)} tokens/s at a TPOT of "
                f"{fmt.seconds(at_knee.step_time_s)} (fits)"
            )
        elif step.fits and most > d.batch:  # only what fits: the largest batch that does
            at_most = cost.decode_step(_deployment(d), most, d.context)
            advice.append(
                f"raise the batch to {fmt.fixed(most, 0)}, the most that fits (the knee at "
                f"{fmt.fixed(knee, 0)} does not): {fmt.rate(at_most.tokens_per_s)} tokens/s at "
                f"a TPOT of {fmt.seconds(at_most.step_time_s)}"
            )
    elif d.batch > knee:
        advice.append(
            f"the batch is past the knee ({fmt.fixed(knee, 0)}): more sequences "
            "mostly add KV traffic and TPOT; watch the tail"
        )
    return Finding(3, "weights or KV", verdict, numbers, advice)


def _tier_batch_advice(d: _Inputs, tiered, numbers: dict) -> list[str]:
    """Batching with the KV read from another tier: each sequence adds its KV to every step's
    transfer, so a larger batch helps only until that transfer paces the step (the tier's
    knee: the first batch whose KV takes as long over the tier as the rest in HBM)."""
    if tiered.bound == "tier":
        return [
            f"a larger batch does not help while the KV is read from {tiered.placement}: every "
            "sequence adds its KV to each step's transfer"
        ]
    grid = tiers.tiered_decode_step(
        _deployment(d), np.array(BATCH_GRID, dtype=float), d.context, d.kv_tier
    )
    paced = np.flatnonzero(np.asarray(grid.bound) != "memory")
    knee = float(BATCH_GRID[paced[0]] if paced.size else BATCH_GRID[-1])
    numbers["tier_knee_batch"] = knee
    if d.batch >= knee:
        return []
    at = tiers.tiered_decode_step(_deployment(d), knee, d.context, d.kv_tier)
    return [
        f"raise the batch towards {fmt.fixed(knee, 0)}, where reading the KV from "
        f"{tiered.placement} starts to pace the step: {fmt.rate(at.tokens_per_s)} tokens/s at "
        f"a TPOT of {fmt.seconds(at.step_time_s)}"
    ]


def _kv_tier(d: _Inputs) -> tuple[Finding, str | None, object]:
    """4. Where the KV really lives (and whether that tier, not HBM, bounds the step)."""

    if d.kv_tier.lower() == tiers.HBM:
        return (
            Finding(4, "KV storage tier", "the KV is read from HBM", {"tier": tiers.HBM}),
            None,
            None,
        )
    t = tiers.tiered_decode_step(_deployment(d), d.batch, d.context, d.kv_tier)
    verdict = (
        f"KV read every step from {t.placement}: {fmt.rate(t.tokens_per_s)} tokens/s "
        f"against {fmt.rate(t.hbm_tokens_per_s)} with the KV in HBM "
        f"({fmt.sig(t.slowdown, 3)}x slower)"
    )
    numbers = {
        "tier": t.placement,
        "tier_bytes": t.tier_bytes,
        "tokens_per_s": t.tokens_per_s,
        "hbm_tokens_per_s": t.hbm_tokens_per_s,
        "slowdown": t.slowdown,
    }
    advice = [
        "move the KV into HBM before decode (one transfer), prefetch the next batch's KV "
        "while computing, and count hits by the tier that served them"
    ]
    return Finding(4, "KV storage tier", verdict, numbers, advice), t.bound, t


def _network(d: _Inputs, step) -> Finding:
    """5. The KV a request sends between nodes (disaggregated serving)."""

    if d.network_bytes_per_s is None:
        return Finding(
            5, "network", "not checked (give the network bandwidth and KV bytes per request)"
        )
    moved = d.kv_bytes_per_request
    transfer = tiers.transfer_time_s(moved, d.network_bytes_per_s)
    per_step = transfer / step.step_time_s
    verdict = (
        f"{fmt.si(moved, 'B')} per request takes {fmt.seconds(transfer)} over the "
        f"network, {fmt.sig(per_step, 3)} decode steps' worth"
    )
    advice = [
        "overlap the transfer with prefill layer by layer so it leaves the critical path",
        "never read KV over the network every step: pull it into the decode node's HBM once",
    ]
    return Finding(
        5,
        "network",
        verdict,
        {
            "transfer_s": transfer,
            "network_bytes_per_s": d.network_bytes_per_s,
            "transfer_in_decode_steps": per_step,
        },
        advice,
    )


def _bound(step, throughput: Finding, tier_bound: str | None, network: Finding) -> str:
    """Which bound the five steps point at."""
    utilisation = throughput.numbers["utilisation"]
    bound = "compute" if step.bound == "compute" else "memory bandwidth"
    if tier_bound == "tier":
        bound = "KV tier"
    per_step = network.numbers.get("transfer_in_decode_steps")
    low = utilisation < LOW_UTILISATION
    if per_step is not None and per_step > 1 and bound == "memory bandwidth" and low:
        bound = "network"
    if bound == "memory bandwidth" and utilisation <= LOW_UTILISATION:
        bound = "overheads"
    if bound == "memory bandwidth" and throughput.numbers["busy_share"] < BUSY_SHARE_FOR_GAPS:
        bound = "launch and host overheads"
    return bound
