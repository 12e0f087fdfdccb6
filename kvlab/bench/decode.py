"""`kvlab bench decode`: measured decode steps of the toy decoder against the ledger.

For each (placement, KV dtype, batch, context) point: the median time of one decode step
at that context, the ledger's prediction for the same shapes with this machine's
*measured* copy bandwidth and matmul rate (`kvlab.decoder.ledger`), their relative error,
and the achieved bandwidth: the bytes the ledger says the step moves / measured time.

A point repeats the same step (same position, same history length), so every repeat
moves the same bytes. `context` is what the ledger calls it: the positions the step
attends, here `context - 1` cached tokens plus the new one (written, then read back with
the rest), so the step reads `context` tokens of KV and writes one, as the ledger counts.
The cache is filled with random history instead of a prefill: the values do not change
the bytes, and prefilling 8 x 32K tokens on a CPU takes hours.
On CUDA, device-placement steps are captured once in a CUDA graph and replayed, so the
timing is the kernels', not Python's launch loop. On CPU the decoder runs kvlab's native
kernels where they build (`kvlab.native`; `kernels="torch"` for PyTorch's), and every point
records which kernels moved its weights and its KV.

The sweep is three pieces: `decode_groups` (the grid, in the order it is measured, with
the points refused up front), `_Sweep.run_point` (one measured point) and `skip_record`
(one record for every point not measured, with its reason). `kvlab bench ... --plan`
walks the same grid without allocating anything.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass

from ..decoder import fit, ledger
from ..errors import KvlabError
from . import kernel_table
from .host_copy import link_bandwidth
from .memory import GiB, MiB, copy_bandwidth, matmul_rate
from .results import environment, write_result
from .timing import Budget, Progress, machine_state, measure_undisturbed, open_device, time_call

K = 1024
GRIDS = {
    # cpu-bench: 0.85 GB of bf16 weights (26x the 32 MiB L3 of the reference machine)
    "cpu": dict(
        preset="cpu-bench",
        weight_dtype="bf16",
        batches=(1, 8),
        contexts=(K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K),
        placements=("device", "host"),
        kv_dtypes=("bf16", "int8"),
        prefetch=(False,),
    ),
    "cpu-quick": dict(
        preset="small",
        weight_dtype="bf16",
        batches=(1, 2),
        contexts=(256, K),
        placements=("device", "host"),
        kv_dtypes=("bf16", "int8"),
        prefetch=(False,),
    ),
    # gpu-bench: ~7 GB of bf16 weights, 64 kB of bf16 KV per token
    "cuda": dict(
        preset="gpu-bench",
        weight_dtype="bf16",
        batches=(1, 8, 32),
        contexts=(K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K),
        placements=("device", "host"),
        kv_dtypes=("bf16", "fp8", "int8"),
        host_kv_dtypes=("bf16",),
        prefetch=(False, True),
    ),
    "cuda-quick": dict(
        preset="gpu-bench",
        weight_dtype="bf16",
        batches=(1, 8),
        contexts=(K, 8 * K),
        placements=("device", "host"),
        kv_dtypes=("bf16",),
        prefetch=(False, True),
    ),
}
#: Host placement moves the whole KV history over PCIe every step; beyond this many
#: tokens (batch x context) a step takes seconds, so larger host points are skipped.
HOST_MAX_TOKENS = {"cpu": 8 * 32 * K, "cuda": 8 * 16 * K}
#: A point is re-measured when the copy bandwidth right before and right after it differ
#: by more than this: something else used the memory bus meanwhile.
MAX_DRIFT = 0.10
#: Bytes of each bracketing copy-bandwidth probe around a point.
PROBE_BYTES = {"cpu": 256 << 20, "cuda": 1 << 30, "cpu-quick": 64 << 20, "cuda-quick": 256 << 20}
OVERRIDES = ("preset", "batches", "contexts", "placements", "kv_dtypes", "weight_dtype", "prefetch")


def resolve_grid(cuda: bool, quick: bool, **overrides) -> dict:
    """The sweep's grid: the default for the device (and --quick), with the given overrides.
    Asking for KV dtypes asks for them in both placements."""
    grid = dict(GRIDS[("cuda" if cuda else "cpu") + ("-quick" if quick else "")])
    grid.update({k: v for k, v in overrides.items() if v is not None and k in OVERRIDES})
    grid["host_kv_dtypes"] = tuple(
        grid["kv_dtypes"]
        if overrides.get("kv_dtypes") is not None
        else grid.get("host_kv_dtypes", grid["kv_dtypes"])
    )
    if not cuda:
        grid["prefetch"] = (False,)  # nothing to overlap with on a CPU
    grid["contexts"] = sorted(int(c) for c in grid["contexts"])
    return grid


@dataclass(frozen=True)
class Group:
    """The points that share one KV cache: a placement, prefetch or not, a KV dtype, a batch."""

    placement: str
    prefetch: bool
    kv_dtype: str
    batch: int

    @property
    def label(self) -> str:
        where = self.placement + ("+prefetch" if self.prefetch else "")
        return f"{where} {self.kv_dtype} b={self.batch}"

    def keys(self, context: int) -> dict:
        return {
            "placement": self.placement,
            "prefetch": self.prefetch,
            "kv_dtype": self.kv_dtype,
            "batch": self.batch,
            "context": context,
        }


def skip_record(group: Group, context: int, reason: str) -> dict:
    """The one record of a point that was not measured, and why."""
    return {**group.keys(context), "reason": reason}


def decode_groups(grid: dict, cuda: bool) -> list[tuple[Group, list[int], list[tuple[int, str]]]]:
    """(group, contexts to measure, [(context, why refused)]) in the order they run.

    The first KV dtype goes first in every placement (device, then host serial, then
    host with prefetch), then the other KV dtypes: a run cut short by its time budget
    still has the points that answer the main questions."""
    limit = HOST_MAX_TOKENS["cuda" if cuda else "cpu"]
    kv_order = list(dict.fromkeys([*grid["kv_dtypes"], *grid["host_kv_dtypes"]]))
    out = []
    for kv in kv_order:
        for placement in grid["placements"]:
            allowed = grid["host_kv_dtypes"] if placement == "host" else grid["kv_dtypes"]
            prefetches = grid["prefetch"] if placement == "host" else (False,)
            if kv not in allowed:
                continue
            for pre in prefetches:
                for batch in grid["batches"]:
                    group = Group(placement, pre, kv, int(batch))
                    out.append((group, *_split_contexts(group, grid["contexts"], limit)))
    return out


def _split_contexts(group: Group, contexts, host_limit: int):
    """(contexts to measure, [(context, why refused)]): host placement stops at `host_limit`
    tokens of batch x context."""
    too_big = [c for c in contexts if group.placement == "host" and group.batch * c > host_limit]
    refused = [(c, f"host placement limited to {host_limit:,} tokens") for c in too_big]
    return [c for c in contexts if c not in too_big], refused


def default_repeats(cuda: bool, quick: bool) -> int:
    """Timed repeats per point: a CPU step takes tens of ms, a GPU step a few."""
    return 3 if quick else 20 if cuda else 5


def point_cost_s(predicted_step_s: float, repeats: int, warmup: int, tries: int = 3) -> float:
    """A generous estimate of one point's wall time: every try's warm-up and repeats at three
    times the predicted step, plus a second of set-up (the budget check and the plan use it)."""
    return 3 * predicted_step_s * (warmup + repeats + tries) + 1.0


def make_step(model, cache, plan, tokens, cuda_graph: bool):
    """A zero-argument callable running one planned decode step and returning its logits
    (B, 1, vocab); (callable, graphed). Device placement on CUDA is captured in a graph."""

    def step():
        return model.forward_plan(tokens, cache, plan)

    if not (cuda_graph and model.device.type == "cuda" and cache.placement == "device"):
        return step, False
    return _graphed(step, model.device)


def _graphed(step, device):
    """Capture `step` in a CUDA graph on `device` (streams, capture and synchronisation all
    name it, so `--device cuda:1` never touches cuda:0); (replay, True), or (step, False)
    when an op cannot be captured."""
    import torch

    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up kernels and the allocator outside the capture
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=side):
                logits = step()  # static output: every replay rewrites it
        except RuntimeError as exc:  # an op that cannot be captured: time it eagerly instead
            torch.cuda.synchronize(device)
            print(
                f"kvlab bench decode: CUDA graph capture failed, running eagerly ({exc})",
                file=sys.stderr,
            )
            return step, False

    def replay():
        graph.replay()
        return logits

    return replay, True


def _measure_point(fn, dev, probe, repeats, warmup, tries):
    """((timing, copy bandwidth before, after), stall, attempts) of one decode step `fn`."""

    def bracketed():  # the bandwidth right before and right after the step's timing
        before = copy_bandwidth(dev, probe, repeats=3, warmup=1)[0]
        timing = time_call(fn, dev, repeats, warmup)
        return timing, before, copy_bandwidth(dev, probe, repeats=3, warmup=1)[0]

    return measure_undisturbed(
        bracketed, attempts=tries, accept=lambda r: abs(r[2] / r[1] - 1) <= MAX_DRIFT
    )


def measure_machine(device, compute_dtype: str, need_link: bool, quick: bool) -> dict:
    """The figures the ledger is fed: copy bandwidth, matmul rate, host->device bandwidth."""
    cuda = str(device).startswith("cuda")
    size = (GiB if cuda else 512 * MiB) if not quick else (256 * MiB if cuda else 128 * MiB)
    (bw, timing), stall, _ = measure_undisturbed(
        lambda: copy_bandwidth(device, size, repeats=5 if quick else 9), attempts=2 if quick else 5
    )
    timing["cpu_stall_fraction"] = stall
    out = {
        "bandwidth_bytes_per_s": bw,
        "bandwidth_timing": timing,
        "bandwidth_size_bytes": size,
        "flops_per_s": matmul_rate(device, compute_dtype),
        "flops_dtype": compute_dtype,
    }
    if need_link:
        out["link_bytes_per_s"], out["link_timing"] = link_bandwidth(
            device, 256 * MiB if not quick else 64 * MiB
        )
    return out


@dataclass
class _Settings:
    repeats: int
    warmup: int
    tries: int  # re-measure a point another process disturbed
    probe_bytes: int
    cuda_graph: bool
    seed: int
    kind: str  # "cpu" | "cuda", "-quick": the grid and the kernel table's shapes


class _Sweep:
    """One decode sweep: the models, the machine's figures, what was measured and skipped."""

    def __init__(  # noqa: PLR0913 - the object's wiring, keyword-only
        self, dev, grid, model, other, machine, spec_device, settings: _Settings, budget_s
    ):
        import torch

        self.dev, self.cuda, self.grid = dev, dev.type == "cuda", grid
        self.model, self.other, self.machine, self.spec_device = model, other, machine, spec_device
        self.s, self.budget = settings, Budget(budget_s)
        self.points, self.skipped, self.other_points = [], [], []
        self.tables: dict[int, dict] = {}  # id(model) -> its kernel table
        self.gen = torch.Generator(device="cpu").manual_seed(settings.seed)
        self.progress = None

    def run(self, groups, quiet: bool) -> None:
        self.progress = Progress("decode", sum(len(c) + len(r) for _, c, r in groups), quiet)
        self.progress.log(self._headline())
        self._measure_tables()
        for group, ctxs, refused in groups:
            for ctx, reason in refused:
                self.skip(group, ctx, reason, reason.replace("limited to", "beyond"))
            if ctxs:
                self.run_group(group, ctxs)

    def _timed_pass(self, fn) -> tuple[float, float]:
        """A kernel-table pass measured as a point's step is (`_measure_point`; in a CUDA graph
        where the steps are graphed): (median seconds, copy bandwidth around it)."""
        if self.cuda and self.s.cuda_graph:
            fn = _graphed(fn, self.dev)[0]
        (t, bw0, bw1), _, _ = _measure_point(
            fn, self.dev, self.s.probe_bytes, self.s.repeats, 1, self.s.tries
        )
        return t.median_s, (bw0 + bw1) / 2

    def _measure_tables(self) -> None:
        """Each kernel set's table (`kernel_table`), timed before the sweep's first point."""
        import torch

        for model in (self.model, self.other):
            if model is None:
                continue
            try:
                with torch.no_grad():
                    table = kernel_table.measure(
                        model,
                        self.grid["kv_dtypes"],
                        self.spec_device,
                        self.grid["weight_dtype"],
                        self.s.kind,
                        self._timed_pass,
                    )
            except (KvlabError, RuntimeError) as exc:
                if not isinstance(exc, KvlabError) and "out of memory" not in str(exc).lower():
                    raise
                self._release()
                self.progress.log(f"kernel table not measured: {str(exc).splitlines()[0]}")
                continue
            self.tables[id(model)] = table
            tag = "" if model is self.model else " [PyTorch kernels]"
            self.progress.log(f"kernel table{tag}: {kernel_table.describe(table)}")

    def _headline(self) -> str:
        m = self.machine
        link = f", link {m['link_bytes_per_s'] / 1e9:.1f} GB/s" if "link_bytes_per_s" in m else ""
        return (
            f"{self.model.config.name}: {self.model.streamed_weight_bytes() / 1e9:.2f} GB of "
            f"{self.grid['weight_dtype']} weights; copy {m['bandwidth_bytes_per_s'] / 1e9:.1f} "
            f"GB/s, matmul {m['flops_per_s'] / 1e12:.2f} TFLOP/s{link}; "
            f"{self.model.kernels_note}{self._variant()}"
        )

    def _variant(self) -> str:
        """'; prefetch l2, AMX; timed on this machine: ...' where the kernels were timed."""
        env = self.model.kernels_environment()
        if "kernel_timing" not in env:
            return ""
        v = env.get("kernel_variant")
        how = ""
        if v:
            how = "; " + ", ".join(
                f"{op} prefetch {x['prefetch']}" + (" + AMX" if x["amx"] else "")
                for op, x in v.items()
            )
        return f"{how}; {env['kernel_timing']['note']}"

    def skip(self, group: Group, ctx: int, reason: str, note: str | None = None) -> None:
        self.skipped.append(skip_record(group, ctx, reason))
        self.progress.step(f"{group.label} ctx={ctx}: skipped ({note or reason})")

    def _release(self) -> None:
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def run_group(self, group: Group, ctxs: list[int]) -> None:
        """Allocate the group's cache once (its longest context), then measure each context."""
        import torch

        try:
            cache = self.model.new_cache(
                group.batch, max(ctxs), group.kv_dtype, group.placement, group.prefetch
            )
            cache.fill_random_([max(ctxs)] * group.batch, seed=self.s.seed)
        except (KvlabError, RuntimeError) as exc:
            if not isinstance(exc, KvlabError) and "out of memory" not in str(exc).lower():
                raise
            cache = None
            self._release()
            for c in ctxs:
                self.skip(group, c, str(exc))
            return
        vocab = self.model.config.vocab_size
        tokens = torch.randint(0, vocab, (group.batch, 1), generator=self.gen).to(self.dev)
        for ctx in ctxs:
            self.run_point(group, cache, tokens, ctx)
        del cache
        self._release()

    def predict(self, group: Group, ctx: int) -> dict:
        return ledger.predict_decode(
            self.model.config,
            self.spec_device,
            group.batch,
            ctx,
            self.grid["weight_dtype"],
            group.kv_dtype,
            group.placement,
            group.prefetch,
            self.machine.get("link_bytes_per_s"),
        )

    def run_point(self, group: Group, cache, tokens, ctx: int) -> None:
        """Measure one point (and its PyTorch-kernel twin when comparing), or record why not."""
        estimate = point_cost_s(
            self.predict(group, ctx)["predicted_step_s"],
            self.s.repeats,
            self.s.warmup,
            self.s.tries,
        )
        if not self.budget.allows(estimate):
            self.skip(group, ctx, "time budget exhausted", "time budget")
            return
        runs = [(self.model, self.points, "")]
        if self.other is not None and group.placement == "device":
            runs.append((self.other, self.other_points, " [PyTorch kernels]"))
        for model, into, tag in runs:  # back to back: both kernel sets see the same machine state
            self._measure_into(model, into, tag, group, cache, tokens, ctx)

    def _measure_into(self, model, into, tag, group, cache, tokens, ctx) -> None:
        import torch

        plan = model.plan(cache, [ctx - 1] * group.batch, 1)  # attends ctx positions
        try:
            with torch.no_grad():
                fn, graphed = make_step(model, cache, plan, tokens, self.s.cuda_graph)
                measured = _measure_point(
                    fn, self.dev, self.s.probe_bytes, self.s.repeats, self.s.warmup, self.s.tries
                )
        except RuntimeError as exc:  # CUDA out of memory (graph pools, temporaries): skip, go on
            if "out of memory" not in str(exc).lower():
                raise
            del plan
            self._release()
            self.skip(group, ctx, f"out of memory: {str(exc).splitlines()[0]}", "out of memory")
            return
        del fn, plan
        point = self.record(model, group, ctx, measured, graphed)
        into.append(point)
        line = f"{group.label} ctx={ctx}{tag}: {describe(point)}"
        if model is self.model:
            self.progress.step(line)
        else:
            self.progress.log(line)

    def record(self, model, group: Group, ctx: int, measured, graphed: bool) -> dict:
        """One decode point: the measurement, and the ledger fed the copy bandwidth measured
        around it (a shared machine's memory bandwidth moves with its neighbours' load)."""
        (t, bw0, bw1), stall, attempts = measured
        bw_point = (bw0 + bw1) / 2
        point_device = ledger.measured_device(
            self.spec_device.name,
            bw_point,
            self.machine["flops_per_s"],
            self.spec_device.capacity_bytes,
        )
        weights = self.grid["weight_dtype"]
        pred = ledger.predict_decode(
            model.config,
            point_device,
            group.batch,
            ctx,
            weights,
            group.kv_dtype,
            group.placement,
            group.prefetch,
            self.machine.get("link_bytes_per_s"),
        )
        measured_s = t.median_s
        point = {
            **group.keys(ctx),
            "weight_dtype": weights,
            "preset": model.config.name,
            "cuda_graph": graphed,
            "kernels": model.decode_kernels(group.kv_dtype),
            "measured_step_s": measured_s,
            "measured_min_s": t.min_s,
            "measured_max_s": t.max_s,
            "spread": t.spread,
            "repeats": self.s.repeats,
            "predicted_step_s": pred["predicted_step_s"],
            "error": measured_s / pred["predicted_step_s"] - 1,
            "step_bytes": pred["step_bytes"],
            "weight_read_bytes": pred["weight_read_bytes"],
            "kv_read_bytes": pred["kv_read_bytes"],
            "fetch_bytes": pred["fetch_bytes"],
            "predicted_fetch_s": pred["fetch_s"],
            "bound": pred["bound"],
            "achieved_bytes_per_s": pred["step_bytes"] / measured_s,
            "fraction_of_bandwidth": pred["step_bytes"] / measured_s / bw_point,
            "bandwidth_bytes_per_s": bw_point,
            "bandwidth_drift": bw1 / bw0 - 1,
            "tokens_per_s": group.batch / measured_s,
            "cpu_stall_fraction": stall,
            "attempts": attempts,
        }
        table = self.tables.get(id(model))
        if table is not None:
            kernels_s = kernel_table.predict_step_s(table, pred, point)
            point["predicted_kernels_step_s"] = kernels_s
            point["kernels_error"] = measured_s / kernels_s - 1
        return point


def describe(point: dict) -> str:
    """One progress line's worth of a measured point."""
    stall = point["cpu_stall_fraction"]
    extra = (f", stalled {stall:.0%}" if stall else "") + (
        f", {point['attempts']} tries" if point["attempts"] > 1 else ""
    )
    return (
        f"{point['measured_step_s'] * 1e3:8.2f} ms, ledger "
        f"{point['predicted_step_s'] * 1e3:8.2f} ms ({point['error']:+.1%}), "
        f"{point['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
        f"{point['fraction_of_bandwidth']:.0%} of copy (spread {point['spread']:.0%}{extra})"
    )


def run_decode(  # noqa: PLR0913 - one keyword per `kvlab bench decode` option
    device="cpu",
    preset=None,
    batches=None,
    contexts=None,
    placements=None,
    kv_dtypes=None,
    weight_dtype=None,
    prefetch=None,
    repeats=None,
    warmup=None,
    budget_s=None,
    quick=False,
    cuda_graph=True,
    quiet=False,
    seed=0,
    kernels="auto",
    compare_kernels=False,
) -> dict:
    """Run the sweep; returns the JSON-ready result (points, machine figures, summary).
    `kernels`: the decoder's CPU kernels, "auto" | "native" | "torch" (see `Decoder`).
    `compare_kernels`: where the decoder runs kvlab's native kernels, time every device-placement
    point a second time, right after, with PyTorch's kernels (same weights, same cache); the
    result then carries that run as `comparison`, a result of the same shape. A shared machine's
    bandwidth drifts, so the two are compared point by point, never across separate runs."""
    from ..decoder import Decoder  # noqa: PLC0415 - torch

    dev, alloc = open_device(device)
    cuda = dev.type == "cuda"
    grid = resolve_grid(
        cuda,
        quick,
        preset=preset,
        batches=batches,
        contexts=contexts,
        placements=placements,
        kv_dtypes=kv_dtypes,
        weight_dtype=weight_dtype,
        prefetch=prefetch,
    )
    kind = ("cuda" if cuda else "cpu") + ("-quick" if quick else "")
    settings = _Settings(
        repeats=repeats or default_repeats(cuda, quick),
        warmup=warmup or (1 if quick else 2),
        tries=1 if quick else 3,
        probe_bytes=PROBE_BYTES[kind],
        cuda_graph=cuda_graph,
        seed=seed,
        kind=kind,
    )
    env = {**environment(str(dev)), **alloc, "at_start": machine_state()}
    model = Decoder(grid["preset"], grid["weight_dtype"], dev, seed=seed, kernels=kernels)
    env.update(model.kernels_environment())
    other = None
    if compare_kernels and model.kernels == "native" and "device" in grid["placements"]:
        other = Decoder(grid["preset"], grid["weight_dtype"], dev, seed=seed, kernels="torch")
    machine = measure_machine(dev, model.compute_dtype_name, "host" in grid["placements"], quick)
    spec_device = ledger.measured_device(
        env["device_name"],
        machine["bandwidth_bytes_per_s"],
        machine["flops_per_s"],
        fit.device_available_bytes(dev),
    )
    sweep = _Sweep(dev, grid, model, other, machine, spec_device, settings, budget_s)
    sweep.run(decode_groups(grid, cuda), quiet)
    env["at_end"] = machine_state()
    result = _result(env, quick, model, grid, spec_device, machine, sweep.points, sweep.skipped)
    result["kernel_table"] = sweep.tables.get(id(model))
    if other is not None:
        other_env = {
            **{k: v for k, v in env.items() if k != "kernel_variant"},
            "kernels": other.kernels,
            "kernels_note": "PyTorch kernels, timed right after kvlab's native kernels at "
            "every point (compare_kernels)",
        }
        result["comparison"] = _result(
            other_env, quick, other, grid, spec_device, machine, sweep.other_points, []
        )
        result["comparison"]["kernel_table"] = sweep.tables.get(id(other))
    return result


def _result(env, quick, model, grid, spec_device, machine, points, skipped) -> dict:  # noqa: PLR0913 - the result's sections, assembled once
    cfg = model.config
    weights = ledger.predict_decode(cfg, spec_device, 1, 0, grid["weight_dtype"], "bf16")[
        "weight_read_bytes"
    ]
    return {
        "benchmark": "decode",
        "environment": env,
        "quick": quick,
        "model": {
            "preset": cfg.name,
            **cfg.to_dict(),
            "weight_dtype": grid["weight_dtype"],
            "compute_dtype": model.compute_dtype_name,
            "streamed_weight_bytes": model.streamed_weight_bytes(),
            "ledger_weight_read_bytes": weights,
        },
        "machine": dict(machine),
        "bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"],
        "prediction": "kvlab.cost.decode_step with the copy bandwidth measured right before and "
        "after each point (their mean, per point in bandwidth_bytes_per_s) and the "
        "measured matmul rate (kvlab.decoder.ledger.predict_decode); host placement "
        "adds the KV fetch over the measured host->device path, overlapped when "
        "prefetching",
        "points": points,
        "skipped": skipped,
        "summary": summarize(points),
    }


def write_comparison(result: dict, device: str, write: bool = True):
    """Take the PyTorch-kernel run out of `result` (compare_kernels) and write it as
    decode-torch-kernels[-quick].json; leaves its summary as `comparison_summary`. Returns
    the path, or None when there was no comparison or `write` is off."""
    comparison = result.pop("comparison", None)
    if comparison is None:
        return None
    result["comparison_summary"] = comparison["summary"]
    if not write:
        return None
    kind = "decode-torch-kernels-quick" if result.get("quick") else "decode-torch-kernels"
    return write_result(kind, comparison, device)


def summarize(points: list[dict]) -> dict:
    """Per (placement, prefetch, kv dtype, batch): worst error and bandwidth fraction over
    contexts."""
    groups: dict[str, list[dict]] = {}
    for p in points:
        where = p["placement"] + ("+prefetch" if p["prefetch"] else "")
        key = f"{where}/{p['kv_dtype']}/b{p['batch']}"
        groups.setdefault(key, []).append(p)
    out = {}
    for key, ps in groups.items():
        out[key] = {
            "contexts": [p["context"] for p in ps],
            "max_abs_error": max(abs(p["error"]) for p in ps),
            "mean_error": sum(p["error"] for p in ps) / len(ps),
            "fraction_of_bandwidth_min": min(p["fraction_of_bandwidth"] for p in ps),
            "fraction_of_bandwidth_max": max(p["fraction_of_bandwidth"] for p in ps),
        }
    return out
