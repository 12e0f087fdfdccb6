"""Mooncake's published serving experiments rerun on kvlab's simulator, row by row.

    .venv/bin/python bench/peers/mooncake_repro.py [--quick] [--json PATH]

Prints one table: what FAST'25 and the arXiv report published, what kvlab finds for the
same setting (kvlab.sim.experiments describes each), and what differs in the model. Rows:

- FAST'25 end to end (section 5.2.2, Figures 1 and 7): the conversation trace and the
  synthetic trace at their own timestamps on 16 nodes per system (8xA800, LLaMA3-70B at
  TP8; Mooncake 8P+8D), effective request capacity at TBT limits of 100, 200 and 300 ms
  (TBT = mean of a request's slowest 10% of gaps; TTFT <= 30 s), Mooncake's gain over
  vLLM (and, for reference, over vLLM with prefix caching and with chunked prefill). Two
  kvlab columns: step times from measured kernels alone, and with a host time per engine
  iteration fitted so that kvlab's Mooncake has the published median TBT (read off the
  paper's figure): kernel tables time the GPU only.
- FAST'25 global vs local cache (section 5.3.2, Figure 10): 10 prefill nodes, 3M tokens
  of cache each, outputs cut to one token: the hit-rate gain and prefill-time ratio.
- The arXiv report (section 8.1.1, Figure 11): Mooncake-[3P+1D] against vLLM-[4M] on
  ArXiv-Summarization- and L-Eval-like Poisson workloads, SLOs at 10x / 5x the lowest
  rate's P90 TTFT / TBT, throughput gain.

--quick replays a third of each trace (its first 20 minutes; the synthetic trace's first
third) with the same 16 nodes, so the per-instance load is the trace's own; it is for a
smoke run, the table in the notes is the full run. The script needs the Mooncake traces
(../shared/data/mooncake or KVLAB_TRACES); without them kvlab's generated stand-ins are
used and every row says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from kvlab.jsonsafe import jsonable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kvlab.published import mooncake  # noqa: E402
from kvlab.sim import experiments as ex  # noqa: E402
from kvlab.sim import simulate, trace_slice  # noqa: E402
from kvlab.traces import trace_or_generated  # noqa: E402


def _gain(a: float, b: float) -> float:
    return a / b - 1 if b > 0 else float("inf")


def _pct(x: float) -> str:
    return f"{x:+.0%}" if x == x and abs(x) != float("inf") else "inf"


def end_to_end(name: str, quick: bool, log) -> dict:
    """FAST'25's effective-capacity experiment on one trace, kernels only and fitted."""
    pub = mooncake(f"fast25_{name}")
    slos = mooncake("fast25_testbed")["tbt_slos_s"]
    trace = trace_or_generated(name)
    if quick:
        span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s
        trace = trace_slice(trace, 0.0, span / 3)
    systems = ex.fast25_systems()
    out = {"trace": trace.label, "requests": len(trace), "published": pub, "kernels": {}}
    runs = {}
    for sys_name, cfg in systems.items():
        t = time.perf_counter()
        r = runs[sys_name] = simulate(trace, cfg)
        s = r.summary()
        out["kernels"][sys_name] = {
            "capacity": ex.capacities(r, cfg.ttft_slo_s, slos),
            "median_tbt_s": ex.median_tbt_s(r),
            "prefix_hit_ratio": s["prefix_hit_ratio"],
            "ttft_p90_s": s["ttft_p90_s"],
            "tpot_p50_s": s["tpot_p50_s"],
        }
        log(f"  {name} {sys_name}: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    fit = ex.fit_step_overhead(trace, systems["mooncake"], pub["mooncake_median_tbt_s"])
    log(
        f"  {name} fit: {fit.step_overhead_s * 1e3:.1f} ms, {fit.runs} runs, "
        f"{time.perf_counter() - t:.1f} s"
    )
    out["fit"] = {"step_overhead_s": fit.step_overhead_s, "median_tbt_s": fit.median_tbt_s}
    fitted = {"mooncake": fit.result}
    for sys_name, cfg in systems.items():
        if sys_name != "mooncake":
            fitted[sys_name] = simulate(
                trace, dataclasses.replace(cfg, step_overhead_s=fit.step_overhead_s)
            )
    out["fitted"] = {
        k: {
            "capacity": ex.capacities(r, systems[k].ttft_slo_s, slos),
            "median_tbt_s": ex.median_tbt_s(r),
        }
        for k, r in fitted.items()
    }
    for col in ("kernels", "fitted"):
        moon = out[col]["mooncake"]["capacity"]
        for k in systems:
            out[col][k]["gain"] = [
                _gain(m, b) for m, b in zip(moon, out[col][k]["capacity"], strict=True)
            ]
    return out


def global_vs_local(name: str, quick: bool, log) -> dict:
    pub = mooncake("fast25_global_vs_local")
    trace = trace_or_generated(name)
    if quick:
        span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s
        trace = trace_slice(trace, 0.0, span / 3)
    trace = ex.one_token_outputs(trace)
    out = {"trace": trace.label}
    for k, cfg in ex.pool_systems().items():
        t = time.perf_counter()
        r = simulate(trace, cfg)
        out[k] = {"hits": r.summary()["prefix_hit_ratio"], "prefill_s": ex.mean_prefill_s(r)}
        log(f"  pools {name} {k}: {time.perf_counter() - t:.1f} s")
    out["hit_gain"] = out["global"]["hits"] / out["local"]["hits"]
    out["hit_gain_least_loaded"] = out["global"]["hits"] / out["local-least-loaded"]["hits"]
    out["prefill_ratio"] = out["global"]["prefill_s"] / out["local"]["prefill_s"]
    out["published_hit_gain"] = pub[f"{name}_hit_gain"]
    out["published_prefill_ratio"] = pub[f"{name}_prefill_time_ratio"]
    out["published_hits"] = pub[f"{name}_hits"]
    return out


def report(name: str, log, requests: int = 200) -> dict:
    pub = mooncake(ex.REPORT_KEYS[name])
    low = pub["lowest_rate_per_s"]
    systems = ex.report_systems()
    t = time.perf_counter()
    light = {
        k: simulate(ex.report_workload(name, low, requests), c).summary()
        for k, c in systems.items()
    }
    ttft_slo, tbt_slo = ex.report_slos(light)
    found = {
        k: ex.p90_throughput(
            c, lambda r: ex.report_workload(name, r, requests), ttft_slo, tbt_slo, low
        )
        for k, c in systems.items()
    }
    log(f"  report {name}: {time.perf_counter() - t:.1f} s")
    return {
        "workload": ex.REPORT_WORKLOADS[name]
        .replace("{rate:g}", "R")
        .format(requests=requests, seed=0),
        "ttft_slo_s": ttft_slo,
        "tbt_slo_s": tbt_slo,
        "hits": {k: s["prefix_hit_ratio"] for k, s in light.items()},
        "throughput": {k: f.rate_per_s for k, f in found.items()},
        "runs": sum(f.runs for f in found.values()) + len(light),
        "gain": _gain(found["mooncake-3p1d"].rate_per_s, found["vllm-4m"].rate_per_s),
        "published_gain": pub["gain"],
    }


DIFF = {
    "kernels": "GPU kernel time only (TensorRT-LLM tables); no host time between steps",
    "conversation": "vLLM's decode stalls behind ~1.3 s prefills either way; with steps as "
    "slow as the paper's engine the stalls cost the slowest tenth of gaps the limit",
    "synthetic": "the same; shorter outputs (149 tokens) leave fewer gaps to a stall",
    "vllm_tbt": "the host time is one constant per iteration, fitted to Mooncake's median and "
    "charged to vLLM's iterations alike (vLLM 0.5's own is not published): where kvlab's vLLM "
    "median passes a limit, the fitted gain at that limit overshoots",
    "pools": "kvlab's cache-aware local router knows every node's cache exactly and queues "
    "are short at the trace's rate, so a conversation stays on its node; the paper's local "
    "set-up hit what one 3M-token cache hits over the whole trace (13.9% in kvlab), between "
    "kvlab's sticky and least-loaded routers: kvlab lacks whatever spread its requests",
    "arxiv-summarization": "lengths fixed at the published means; P90 TBT of per-request mean gaps",
    "l-eval": "kvlab's single decode node never binds at these rates; in the report the "
    "3P+1D's P90 TBT climbs with the rate at 72-token outputs (Figure 11), a per-arrival "
    "cost on the decode node (receiving a 19k-token prompt's KV) kvlab does not charge",
}


def table(res: dict) -> list[list[str]]:
    rows = [["experiment", "published", "kvlab (kernels)", "kvlab (+host time)", "difference"]]
    for name in ("conversation", "synthetic"):
        e = res[name]
        fit_ms = e["fit"]["step_overhead_s"] * 1e3
        for i, slo in enumerate(mooncake("fast25_testbed")["tbt_slos_s"]):
            rows.append(
                [
                    f"FAST'25 {name}, TBT <= {slo * 1e3:g} ms: Mooncake over vLLM",
                    _pct(e["published"]["gains"][i]),
                    _pct(e["kernels"]["vllm"]["gain"][i]),
                    _pct(e["fitted"]["vllm"]["gain"][i]),
                    (DIFF[name] if i == 0 else "")
                    + (f" (host time fitted: {fit_ms:.0f} ms/iteration)" if i == 0 else ""),
                ]
            )
        for base in ("vllm-prefix-caching", "vllm-chunked-prefill"):
            k, f = e["kernels"][base]["gain"], e["fitted"][base]["gain"]
            rows.append(
                [
                    f"  over {base} (100/200/300 ms)",
                    "(figure only)",
                    "/".join(_pct(x) for x in k),
                    "/".join(_pct(x) for x in f),
                    "",
                ]
            )
        rows.append(
            [
                f"  vLLM median TBT ({name})",
                "(not read)",
                f"{e['kernels']['vllm']['median_tbt_s'] * 1e3:.0f} ms",
                f"{e['fitted']['vllm']['median_tbt_s'] * 1e3:.0f} ms",
                DIFF["vllm_tbt"] if name == "conversation" else "",
            ]
        )
        rows.append(
            [
                f"  Mooncake median TBT ({name})",
                f"{e['published']['mooncake_median_tbt_s'] * 1e3:.0f} ms (read off the figure)",
                f"{e['kernels']['mooncake']['median_tbt_s'] * 1e3:.0f} ms",
                f"{e['fitted']['mooncake']['median_tbt_s'] * 1e3:.0f} ms",
                DIFF["kernels"] if name == "conversation" else "",
            ]
        )
    for name in ("conversation", "synthetic"):
        p = res[f"pools_{name}"]
        rows.append(
            [
                f"FAST'25 global/local cache hits, {name}",
                f"{p['published_hit_gain']:.2f}x ({p['published_hits'][1]:.0%} vs "
                f"{p['published_hits'][0]:.0%})",
                f"{p['hit_gain']:.2f}x ({p['global']['hits']:.0%} vs {p['local']['hits']:.0%}); "
                f"{p['hit_gain_least_loaded']:.2f}x against least-loaded local "
                f"({p['local-least-loaded']['hits']:.0%})",
                "",
                DIFF["pools"] if name == "conversation" else "",
            ]
        )
        rows.append(
            [
                f"  prefill time global/local, {name}",
                f"{p['published_prefill_ratio']:.2f}x",
                f"{p['prefill_ratio']:.2f}x",
                "",
                "",
            ]
        )
    for name in ex.REPORT_WORKLOADS:
        r = res[f"report_{name}"]
        tp = r["throughput"]
        rows.append(
            [
                f"report {name}: 3P+1D over vLLM-[4M]",
                _pct(r["published_gain"]),
                f"{_pct(r['gain'])} ({tp['mooncake-3p1d']:.2f} vs {tp['vllm-4m']:.2f} req/s)",
                "",
                DIFF[name],
            ]
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a third of each trace (smoke run)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.1f} s]{msg}", file=sys.stderr, flush=True)

    res = {}
    for name in ("conversation", "synthetic"):
        res[name] = end_to_end(name, args.quick, log)
        res[f"pools_{name}"] = global_vs_local(name, args.quick, log)
    for name in ex.REPORT_WORKLOADS:
        res[f"report_{name}"] = report(name, log)
    rows = table(res)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    print(f"\ntraces: {res['conversation']['trace']}; {res['synthetic']['trace']}")
    for name in ex.REPORT_WORKLOADS:
        r = res[f"report_{name}"]
        print(
            f"report {name}: {r['workload']}; SLOs TTFT {r['ttft_slo_s']:.2f} s, TBT "
            f"{r['tbt_slo_s'] * 1e3:.0f} ms (P90); hits at the lowest rate {r['hits']}"
        )
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(jsonable(res), indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
