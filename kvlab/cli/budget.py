"""`kvlab budget`: the ledger of one decode step, as a table or JSON.

The JSON keys are a contract other scripts use (see README): weight_bytes,
kv_bytes_per_token, kv_read_bytes, step_bytes, step_time_s, tokens_per_s,
tokens_per_s_per_sequence, kv_cache_bytes, fits, max_batch, bound, arithmetic_intensity;
also ceiling_step_time_s (efficiency 1) beside step_time_s, efficiency_source, and the
step's operators.
"""
from __future__ import annotations

import argparse

from .args import count, number, print_json


def efficiency(text: str):
    """A fraction such as 0.8, or 'measured' (kernel tables)."""
    if text.strip().lower() == "measured":
        return "measured"
    try:
        return number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 0.8 or 'measured', got {text!r}") from None


def register(sub) -> None:
    p = sub.add_parser(
        "budget",
        help="bytes, FLOPs, time and memory fit of one decode step",
        description="The ledger of one decode step: weights streamed once for the batch, "
        "plus every sequence's KV history, against the device's bandwidth and FLOP/s.",
    )
    p.add_argument("--model", required=True, help="catalogue name (see 'kvlab models') or a config.json path")
    p.add_argument("--hardware", default="h100-sxm", help="device name (see 'kvlab hardware'); default h100-sxm")
    p.add_argument("--bandwidth", type=number, metavar="BYTES_PER_S", help="memory bandwidth in bytes/s, instead of the device's peak")
    p.add_argument("--batch", type=count, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--context", type=count, default=4096, help="tokens of KV history per sequence (default 4096; 4k works)")
    p.add_argument("--weight-dtype", default="fp16", help="fp32, bf16, fp16, fp8, int8, int4, or with a group: int4-g128")
    p.add_argument("--kv-dtype", default="fp16", help="dtype of the KV cache (same names)")
    p.add_argument("--cached", type=count, default=0, metavar="TOKENS",
                   help="prompt tokens served by a prefix-cache hit, for the TTFT of one request (default 0)")
    from ..measured.tables import devices_with_data

    p.add_argument("--efficiency", type=efficiency, default=1.0,
                   help="fraction of peak bandwidth/FLOP/s reached (default 1.0, the ceiling), or "
                   "'measured': every operator timed from published kernel tables (TensorRT-LLM, "
                   f"via aiconfigurator-core; {', '.join(devices_with_data())})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    result = budget(args.model, args.hardware, args.batch, args.context, args.weight_dtype, args.kv_dtype,
                    args.efficiency, args.bandwidth, args.cached)
    if args.json:
        print_json(result)
    else:
        print(render(result))
    return 0


def budget(model, hardware, batch, context, weight_dtype="fp16", kv_dtype="fp16", efficiency=1.0,
           bandwidth=None, cached=0) -> dict:
    """The `kvlab budget --json` object: the decode-step ledger, memory fit, the step's
    operators, and the TTFT of one request whose prompt is `context` tokens, `cached` of
    them served by a prefix hit. In measured mode a prompt outside the prefill tables gives
    `ttft_s: null` and says why in `notes` (the decode step itself must be inside them)."""
    from ..cost import decode_step, memory_fit, prefill
    from ..errors import KvlabError

    kwargs = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    step = decode_step(model, hardware, batch, context, bandwidth_bytes_per_s=bandwidth, efficiency=efficiency, **kwargs)
    fit = memory_fit(model, hardware, batch, context, **kwargs)
    notes = []
    try:
        first = prefill(model, hardware, max(context, 1), cached_tokens=cached, efficiency=efficiency,
                        bandwidth_bytes_per_s=bandwidth, **kwargs).to_dict()
    except KvlabError as exc:
        if efficiency != "measured":
            raise
        notes.append(f"TTFT not measured: {exc}")
        first = prefill(model, hardware, max(context, 1), cached_tokens=cached, **kwargs).to_dict()
        first["ttft_s"] = None
    from ..ledger_rows import operator_table

    operators = operator_table(model, hardware, batch, context, efficiency=efficiency,
                               bandwidth_bytes_per_s=bandwidth, **kwargs)
    return {**step.to_dict(), "max_context": fit.to_dict()["max_context"],
            "cached_tokens": first["cached_tokens"], "ttft_s": first["ttft_s"],
            "prefill_flops": first["flops"], "prefill_bound": first["bound"],
            "operators": operators, "notes": notes}


def render(r: dict) -> str:
    """The ledger as a short readable report."""
    from ..fmt import rate, seconds, si

    total = r["step_bytes"]

    def share(x):
        return f"{100 * x / total:5.1f}%"

    fit = "fits" if r["fits"] else "does NOT fit"
    max_ctx = "unbounded (sliding window)" if r["max_context"] is None else f"{int(r['max_context']):,} tokens"
    measured = r["efficiency"] == "measured"
    how = "kernels timed from measured tables" if measured else f"x efficiency {r['efficiency']:g}"
    ttft = "not measured" if r["ttft_s"] is None else seconds(r["ttft_s"])
    lines = [
        f"kvlab budget: {r['model']} on {r['hardware']}, bandwidth {si(r['bandwidth_bytes_per_s'], 'B/s')}"
        f" {how}",
        f"batch {int(r['batch']):,}, context {int(r['context']):,} tokens, weights {r['weight_dtype']}, KV {r['kv_dtype']}",
        "",
        "bytes moved by one decode step",
        f"  weights read       {si(r['weight_read_bytes'], 'B'):>10}  {share(r['weight_read_bytes'])}",
        f"  KV history read    {si(r['kv_read_bytes'], 'B'):>10}  {share(r['kv_read_bytes'])}"
        f"   ({si(r['kv_bytes_per_token'], 'B')} per token)",
        f"  KV written         {si(r['kv_write_bytes'], 'B'):>10}  {share(r['kv_write_bytes'])}",
        f"  total              {si(total, 'B'):>10}",
        "",
        f"time per step (TPOT) {seconds(r['step_time_s']):>10}  {r['bound']}-bound"
        f" (intensity {r['arithmetic_intensity']:.3g} FLOP/B, ridge {r['ridge_flops_per_byte']:.3g})",
        f"  ceiling            {seconds(r['ceiling_step_time_s']):>10}  every operator at its own"
        f" max(bytes/bandwidth, FLOPs/peak)",
        f"  time from          {r['efficiency_source']}",
        f"throughput           {rate(r['tokens_per_s']):>10}  tokens/s in aggregate,"
        f" {rate(r['tokens_per_s_per_sequence'])} per sequence",
        f"first token (TTFT)   {ttft:>10}  prefill of a {int(r['context']):,}-token prompt,"
        f" {int(r['cached_tokens']):,} of them from the prefix cache ({r['prefill_bound']}-bound)",
        f"memory               {si(r['memory_needed_bytes'], 'B'):>10}  of {si(r['capacity_bytes'], 'B')}: {fit};"
        f" max batch at this context {int(r['max_batch']):,}, max context at this batch {max_ctx}",
    ]
    if r["operators"]:
        lines += ["", _operators(r["operators"], measured)]
    lines += [f"note: {note}" for note in r["notes"]]
    return "\n".join(lines)


def _operators(rows: list[dict], measured: bool) -> str:
    """The per-operator breakdown: launches, bytes, FLOPs, ceiling (and measured) time."""
    from ..fmt import seconds, si
    from .args import table

    header = ["operator", "calls", "bytes", "FLOPs", "ceiling"]
    header += ["measured", "from"] if measured else []
    body = []
    for row in rows:
        cells = [row["name"], str(row["calls"]), si(row["bytes"], "B"), si(row["flops"], "FLOP"),
                 seconds(row["ceiling_s"])]
        if measured:
            cells += [seconds(row["measured_s"]), row["how"].split(":", 1)[0]]
        body.append(cells)
    return "operators of one step (all layers)\n" + table(body, header)
