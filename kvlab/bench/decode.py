"""`kvlab bench decode`: measured decode steps of the toy decoder against the ledger.

For each (placement, KV dtype, batch, context) point: the median time of one decode step
at that context, the ledger's prediction for the same shapes with this machine's
*measured* copy bandwidth and matmul rate (`kvlab.decoder.ledger`), their relative error,
and the achieved bandwidth: the bytes the ledger says the step moves / measured time.

A point repeats the same step (same position, same history length), so every repeat
moves the same bytes. `context` is what the ledger calls it: the positions the step
attends, here `context - 1` cached tokens plus the new one (written, then read back with
the rest), so the step reads `context` tokens of KV and writes one, as the ledger counts. The cache is filled with random history instead of a prefill:
the values do not change the bytes, and prefilling 8 x 32K tokens on a CPU takes hours.
On CUDA, device-placement steps are captured once in a CUDA graph and replayed, so the
timing is the kernels', not Python's launch loop. On CPU the decoder runs kvlab's native
kernels where they build (`kvlab.native`; `kernels="torch"` for PyTorch's), and every point
records which kernels moved its weights and its KV.
"""
from __future__ import annotations

import gc
import sys

from ..errors import KvlabError
from .memory import copy_bandwidth
from .results import environment
from .timing import Budget, Progress, machine_state, measure_undisturbed, open_device, time_call

K = 1024
GRIDS = {
    # cpu-bench: 0.85 GB of bf16 weights (26x the 32 MiB L3 of the reference machine)
    "cpu": dict(preset="cpu-bench", weight_dtype="bf16", batches=(1, 8),
                contexts=(K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K), placements=("device", "host"),
                kv_dtypes=("bf16", "int8"), prefetch=(False,)),
    "cpu-quick": dict(preset="small", weight_dtype="bf16", batches=(1, 2), contexts=(256, K),
                      placements=("device", "host"), kv_dtypes=("bf16", "int8"), prefetch=(False,)),
    # gpu-bench: ~7 GB of bf16 weights, 64 kB of bf16 KV per token
    "cuda": dict(preset="gpu-bench", weight_dtype="bf16", batches=(1, 8, 32),
                 contexts=(K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K), placements=("device", "host"),
                 kv_dtypes=("bf16", "fp8", "int8"), host_kv_dtypes=("bf16",), prefetch=(False, True)),
    "cuda-quick": dict(preset="gpu-bench", weight_dtype="bf16", batches=(1, 8), contexts=(K, 8 * K),
                       placements=("device", "host"), kv_dtypes=("bf16",), prefetch=(False, True)),
}
#: Host placement moves the whole KV history over PCIe every step; beyond this many
#: tokens (batch x context) a step takes seconds, so larger host points are skipped.
HOST_MAX_TOKENS = {"cpu": 8 * 32 * K, "cuda": 8 * 16 * K}
#: A point is re-measured when the copy bandwidth right before and right after it differ
#: by more than this: something else used the memory bus meanwhile.
MAX_DRIFT = 0.10


def make_step(model, cache, plan, tokens, cuda_graph: bool):
    """A zero-argument callable running one planned decode step and returning its logits
    (B, 1, vocab); (callable, graphed). Device placement on CUDA is captured in a graph."""
    import torch

    def step():
        return model.forward_plan(tokens, cache, plan)

    if not (cuda_graph and model.device.type == "cuda" and cache.placement == "device"):
        return step, False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up kernels and the allocator outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            logits = step()  # static output: every replay rewrites it
    except RuntimeError as exc:  # an op that cannot be captured: time it eagerly instead
        torch.cuda.synchronize()
        print(f"kvlab bench decode: CUDA graph capture failed, running eagerly ({exc})", file=sys.stderr)
        return step, False

    def replay():
        graph.replay()
        return logits

    return replay, True


def _measure_point(model, cache, plan, tokens, cuda_graph, probe, repeats, warmup, tries, dev):
    """((timing, copy bandwidth before, after, graphed), stall, attempts) of one decode point."""
    import torch

    with torch.no_grad():
        fn, graphed = make_step(model, cache, plan, tokens, cuda_graph)

        def bracketed():  # the bandwidth right before and right after the step's timing
            before = copy_bandwidth(dev, probe, repeats=3, warmup=1)[0]
            timing = time_call(fn, dev, repeats, warmup)
            return timing, before, copy_bandwidth(dev, probe, repeats=3, warmup=1)[0], graphed

        return measure_undisturbed(bracketed, attempts=tries, accept=lambda r: abs(r[2] / r[1] - 1) <= MAX_DRIFT)


def _point_record(model, cfg, weight_dtype, device_name, machine, spec_device, batch, ctx, placement, pre, kv,
                  repeats, measured_point) -> dict:
    """One decode point: the measurement, and the ledger fed the copy bandwidth measured around it."""
    from ..decoder import ledger

    (t, bw0, bw1, graphed), stall, attempts = measured_point
    measured, bw_point = t.median_s, (bw0 + bw1) / 2
    # the ledger with the bandwidth this machine had while the point ran (a shared VM's
    # memory bandwidth moves with its neighbours' load)
    point_device = ledger.measured_device(device_name, bw_point, machine["flops_per_s"], spec_device.capacity_bytes)
    pred = ledger.predict_decode(cfg, point_device, batch, ctx, weight_dtype, kv, placement, pre,
                                 machine.get("link_bytes_per_s"))
    return {
        "batch": batch, "context": ctx, "placement": placement, "prefetch": pre, "kv_dtype": kv,
        "weight_dtype": weight_dtype, "preset": cfg.name, "cuda_graph": graphed,
        "kernels": model.decode_kernels(kv),
        "measured_step_s": measured, "measured_min_s": t.min_s, "measured_max_s": t.max_s,
        "spread": t.spread, "repeats": repeats,
        "predicted_step_s": pred["predicted_step_s"], "error": measured / pred["predicted_step_s"] - 1,
        "step_bytes": pred["step_bytes"], "weight_read_bytes": pred["weight_read_bytes"],
        "kv_read_bytes": pred["kv_read_bytes"], "fetch_bytes": pred["fetch_bytes"],
        "predicted_fetch_s": pred["fetch_s"], "bound": pred["bound"],
        "achieved_bytes_per_s": pred["step_bytes"] / measured,
        "fraction_of_bandwidth": pred["step_bytes"] / measured / bw_point,
        "bandwidth_bytes_per_s": bw_point, "bandwidth_drift": bw1 / bw0 - 1,
        "tokens_per_s": batch / measured,
        "cpu_stall_fraction": stall, "attempts": attempts,
    }


def measure_machine(device, compute_dtype: str, need_link: bool, quick: bool) -> dict:
    """The figures the ledger is fed: copy bandwidth, matmul rate, host->device bandwidth."""
    from .memory import GiB, MiB, matmul_rate
    from .transfer import link_bandwidth

    cuda = str(device).startswith("cuda")
    size = (GiB if cuda else 512 * MiB) if not quick else (256 * MiB if cuda else 128 * MiB)
    (bw, timing), stall, _ = measure_undisturbed(lambda: copy_bandwidth(device, size, repeats=5 if quick else 9),
                                                 attempts=2 if quick else 5)
    timing["cpu_stall_fraction"] = stall
    out = {"bandwidth_bytes_per_s": bw, "bandwidth_timing": timing, "bandwidth_size_bytes": size,
           "flops_per_s": matmul_rate(device, compute_dtype), "flops_dtype": compute_dtype}
    if need_link:
        out["link_bytes_per_s"], out["link_timing"] = link_bandwidth(device, 256 * MiB if not quick else 64 * MiB)
    return out


def run_decode(device="cpu", preset=None, batches=None, contexts=None, placements=None, kv_dtypes=None,
               weight_dtype=None, prefetch=None, repeats=None, warmup=None, budget_s=None, quick=False,
               cuda_graph=True, quiet=False, seed=0, kernels="auto", compare_kernels=False) -> dict:
    """Run the sweep; returns the JSON-ready result (points, machine figures, summary).
    `kernels`: the decoder's CPU kernels, "auto" | "native" | "torch" (see `Decoder`).
    `compare_kernels`: where the decoder runs kvlab's native kernels, time every device-placement
    point a second time, right after, with PyTorch's kernels (same weights, same cache); the
    result then carries that run as `comparison`, a result of the same shape. A shared machine's
    bandwidth drifts, so the two are compared point by point, never across separate runs."""
    import torch

    from ..decoder import Decoder, fit
    from ..decoder import ledger

    dev, alloc = open_device(device)
    cuda = dev.type == "cuda"
    grid = dict(GRIDS[("cuda" if cuda else "cpu") + ("-quick" if quick else "")])
    for key, value in (("preset", preset), ("batches", batches), ("contexts", contexts), ("placements", placements),
                       ("kv_dtypes", kv_dtypes), ("weight_dtype", weight_dtype), ("prefetch", prefetch)):
        if value is not None:
            grid[key] = value
    if not cuda:
        grid["prefetch"] = (False,)  # nothing to overlap with on a CPU
    repeats = repeats or (3 if quick else 5 if not cuda else 20)
    warmup = warmup or (1 if quick else 2)
    tries = 1 if quick else 3  # re-measure a point another process disturbed
    budget = Budget(budget_s)
    env = {**environment(str(dev)), **alloc, "at_start": machine_state()}

    model = Decoder(grid["preset"], grid["weight_dtype"], dev, seed=seed, kernels=kernels)
    env["kernels"], env["kernels_note"] = model.kernels, model.kernels_note
    other = None
    if compare_kernels and model.kernels == "native" and "device" in grid["placements"]:
        other = Decoder(grid["preset"], grid["weight_dtype"], dev, seed=seed, kernels="torch")
    machine = measure_machine(dev, model.compute_dtype_name, "host" in grid["placements"], quick)
    spec_device = ledger.measured_device(
        env["device_name"], machine["bandwidth_bytes_per_s"], machine["flops_per_s"],
        fit.device_available_bytes(dev))
    cfg = model.config
    probe = (64 if quick else 256) * (1 << 20) * (4 if cuda else 1)  # bytes per bracketing copy
    host_kv = grid["kv_dtypes"] if kv_dtypes is not None else grid.get("host_kv_dtypes", grid["kv_dtypes"])
    groups = [(pl, pf, kv, b) for pl in grid["placements"] for pf in (grid["prefetch"] if pl == "host" else (False,))
              for kv in (host_kv if pl == "host" else grid["kv_dtypes"]) for b in grid["batches"]]
    contexts = sorted(int(c) for c in grid["contexts"])
    progress = Progress("decode", len(groups) * len(contexts), quiet)
    progress.log(f"{cfg.name}: {model.streamed_weight_bytes() / 1e9:.2f} GB of {grid['weight_dtype']} weights; "
                 f"copy {machine['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, matmul "
                 f"{machine['flops_per_s'] / 1e12:.2f} TFLOP/s" +
                 (f", link {machine['link_bytes_per_s'] / 1e9:.1f} GB/s" if "link_bytes_per_s" in machine else "") +
                 f"; {model.kernels_note}")
    points, skipped, other_points = [], [], []
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for placement, pre, kv, batch in groups:
        label = f"{placement}{'+prefetch' if pre else ''} {kv} b={batch}"
        ctxs = contexts
        if placement == "host":
            limit = HOST_MAX_TOKENS["cuda" if cuda else "cpu"]
            ctxs = [c for c in contexts if batch * c <= limit]
            for c in contexts:
                if batch * c > limit:
                    skipped.append({"placement": placement, "prefetch": pre, "kv_dtype": kv, "batch": batch,
                                    "context": c, "reason": f"host placement limited to {limit:,} tokens"})
                    progress.step(f"{label} ctx={c}: skipped (host placement beyond {limit:,} tokens)")
        if not ctxs:
            continue
        try:
            cache = model.new_cache(batch, max(ctxs), kv, placement, pre)
            cache.fill_random_([max(ctxs)] * batch, seed=seed)
        except (KvlabError, RuntimeError) as exc:
            if not isinstance(exc, KvlabError) and "out of memory" not in str(exc).lower():
                raise
            cache = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            for c in ctxs:
                skipped.append({"placement": placement, "prefetch": pre, "kv_dtype": kv, "batch": batch,
                                "context": c, "reason": str(exc)})
                progress.step(f"{label} ctx={c}: skipped ({exc})")
            continue
        tokens = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen).to(dev)
        for ctx in ctxs:
            pred = ledger.predict_decode(cfg, spec_device, batch, ctx, grid["weight_dtype"], kv, placement, pre,
                                         machine.get("link_bytes_per_s"))
            estimate = 3 * pred["predicted_step_s"] * (warmup + repeats + 3) + 1.0
            if not budget.allows(estimate):
                skipped.append({"placement": placement, "prefetch": pre, "kv_dtype": kv, "batch": batch,
                                "context": ctx, "reason": "time budget exhausted"})
                progress.step(f"{label} ctx={ctx}: skipped (time budget)")
                continue
            runs = [(model, points, "")]
            if other is not None and placement == "device":
                runs.append((other, other_points, " [PyTorch kernels]"))
            for m, into, tag in runs:  # back to back: both kernel sets see the same machine state
                plan = m.plan(cache, [ctx - 1] * batch, 1)  # attends ctx positions
                try:
                    measured_point = _measure_point(m, cache, plan, tokens, cuda_graph, probe, repeats, warmup, tries,
                                                    dev)
                except RuntimeError as exc:  # CUDA out of memory (graph pools, temporaries): skip, go on
                    if "out of memory" not in str(exc).lower():
                        raise
                    skipped.append({"placement": placement, "prefetch": pre, "kv_dtype": kv, "batch": batch,
                                    "context": ctx, "reason": f"out of memory: {str(exc).splitlines()[0]}"})
                    progress.step(f"{label} ctx={ctx}: skipped (out of memory)")
                    del plan
                    if cuda:
                        torch.cuda.empty_cache()
                    continue
                del plan
                point = _point_record(m, cfg, grid["weight_dtype"], env["device_name"], machine, spec_device,
                                      batch, ctx, placement, pre, kv, repeats, measured_point)
                into.append(point)
                line = (f"{label} ctx={ctx}{tag}: {point['measured_step_s'] * 1e3:8.2f} ms, ledger "
                        f"{point['predicted_step_s'] * 1e3:8.2f} ms ({point['error']:+.1%}), "
                        f"{point['achieved_bytes_per_s'] / 1e9:.1f} GB/s = "
                        f"{point['fraction_of_bandwidth']:.0%} of copy "
                        f"(spread {point['spread']:.0%}" +
                        (f", stalled {point['cpu_stall_fraction']:.0%}" if point['cpu_stall_fraction'] else "") +
                        (f", {point['attempts']} tries" if point['attempts'] > 1 else "") + ")")
                if m is model:
                    progress.step(line)
                else:
                    progress.log(line)
        del cache
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    env["at_end"] = machine_state()
    result = _result(env, quick, model, cfg, grid, spec_device, machine, points, skipped)
    if other is not None:
        other_env = {**env, "kernels": other.kernels, "kernels_note": "PyTorch kernels, timed right after kvlab's "
                     "native kernels at every point (compare_kernels)"}
        result["comparison"] = _result(other_env, quick, other, cfg, grid, spec_device, machine, other_points, [])
    return result


def _result(env, quick, model, cfg, grid, spec_device, machine, points, skipped) -> dict:
    from ..decoder import ledger

    return {
        "benchmark": "decode",
        "environment": env,
        "quick": quick,
        "model": {"preset": cfg.name, **cfg.to_dict(), "weight_dtype": grid["weight_dtype"],
                  "compute_dtype": model.compute_dtype_name,
                  "streamed_weight_bytes": model.streamed_weight_bytes(),
                  "ledger_weight_read_bytes": ledger.predict_decode(cfg, spec_device, 1, 0, grid["weight_dtype"],
                                                                    "bf16")["weight_read_bytes"]},
        "machine": {k: v for k, v in machine.items()},
        "bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"],
        "prediction": "kvlab.cost.decode_step with the copy bandwidth measured right before and after each "
                      "point (their mean, per point in bandwidth_bytes_per_s) and the measured matmul rate "
                      "(kvlab.decoder.ledger.predict_decode); host placement adds the KV fetch over the "
                      "measured host->device path, overlapped when prefetching",
        "points": points,
        "skipped": skipped,
        "summary": summarize(points),
    }


def write_comparison(result: dict, device: str, write: bool = True):
    """Take the PyTorch-kernel run out of `result` (compare_kernels) and write it as
    decode-torch-kernels[-quick].json; leaves its summary as `comparison_summary`. Returns
    the path, or None when there was no comparison or `write` is off."""
    from .results import write_result

    comparison = result.pop("comparison", None)
    if comparison is None:
        return None
    result["comparison_summary"] = comparison["summary"]
    if not write:
        return None
    kind = "decode-torch-kernels-quick" if result.get("quick") else "decode-torch-kernels"
    return write_result(kind, comparison, device)


def summarize(points: list[dict]) -> dict:
    """Per (placement, prefetch, kv dtype, batch): worst error and bandwidth fraction over contexts."""
    groups: dict[str, list[dict]] = {}
    for p in points:
        key = f"{p['placement']}{'+prefetch' if p['prefetch'] else ''}/{p['kv_dtype']}/b{p['batch']}"
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
