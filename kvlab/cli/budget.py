"""`kvlab budget`: the ledger of one decode step, as a table or JSON.

The JSON keys are a contract other scripts use (see README): weight_bytes,
kv_bytes_per_token, kv_read_bytes, step_bytes, step_time_s, tokens_per_s,
tokens_per_s_per_sequence, kv_cache_bytes, fits, max_batch, bound, arithmetic_intensity;
also ceiling_step_time_s (efficiency 1) beside step_time_s, efficiency_source, and the
step's operators. The two levers past the per-user ceiling add tensor_parallel,
allreduce_time_s, allreduce_latency_s (figures per GPU at --tensor-parallel N) and
tokens_per_verify_step, speculative_speedup, speculative_breakeven_batch and the
`speculative` object (--speculative-tokens K); the top-level ledger stays the plain
decode step they are compared with.
"""

from __future__ import annotations

import argparse

from ..cost import decode_step, memory_fit, prefill
from ..deployment import Ceiling, Deployment, parse_speed
from ..errors import KvlabError
from ..fmt import rate, seconds, si
from ..kernel_tables.tables import devices_with_data
from ..ledger_rows import operator_rows
from ..speculative import breakeven_batch, speculative_step
from . import add_command
from .args import count, number, print_json, table


def efficiency(text: str):
    """A fraction such as 0.8, or 'measured' (the published kernel tables), as a speed."""
    try:
        return parse_speed(text)
    except KvlabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    p = add_command(
        sub,
        "budget",
        "The ledger of one decode step: weights streamed once for the batch, "
        "plus every sequence's KV history, against the device's bandwidth and FLOP/s.",
    )
    p.add_argument(
        "--model", required=True, help="catalogue name (see 'kvlab models') or a config.json path"
    )
    p.add_argument(
        "--hardware",
        default="h100-sxm",
        help="device name (see 'kvlab hardware'); default h100-sxm",
    )
    p.add_argument(
        "--bandwidth",
        type=number,
        metavar="BYTES_PER_S",
        help="memory bandwidth in bytes/s, instead of the device's peak",
    )
    p.add_argument("--batch", type=count, default=1, help="sequences decoded together (default 1)")
    p.add_argument(
        "--context",
        type=count,
        default=4096,
        help="tokens of KV history per sequence (default 4096; 4k works)",
    )
    p.add_argument(
        "--weight-dtype",
        default="fp16",
        help="fp32, bf16, fp16, fp8, int8, int4, or with a group: int4-g128",
    )
    p.add_argument("--kv-dtype", default="fp16", help="dtype of the KV cache (same names)")
    p.add_argument(
        "--cached",
        type=count,
        default=0,
        metavar="TOKENS",
        help="prompt tokens served by a prefix-cache hit, for the TTFT of one request (default 0)",
    )
    p.add_argument(
        "--efficiency",
        type=efficiency,
        default="1.0",
        help="fraction of peak bandwidth/FLOP/s reached (default 1.0, the ceiling), or "
        "'measured': every operator timed from published kernel tables (TensorRT-LLM, "
        f"via aiconfigurator-core; {', '.join(devices_with_data())})",
    )
    p.add_argument(
        "--tensor-parallel",
        type=count,
        default=1,
        metavar="N",
        help="split weights and K/V heads over N GPUs of one server (1, 2, 4, 8): "
        "two all-reduces per layer over the device's GPU link; figures per GPU",
    )
    p.add_argument(
        "--speculative-tokens",
        type=count,
        default=0,
        metavar="K",
        help="speculative decoding: draft K tokens, verify them in one pass (default 0: off)",
    )
    p.add_argument(
        "--acceptance",
        type=number,
        metavar="A",
        help="probability each drafted token is accepted (needs --speculative-tokens)",
    )
    p.add_argument(
        "--draft-model",
        metavar="NAME",
        help="a draft model (catalogue name or config.json) with the target's "
        "vocabulary; omitted: self-drafting heads (EAGLE / MTP style)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    d = Deployment(
        args.model,
        args.hardware,
        args.weight_dtype,
        args.kv_dtype,
        args.efficiency,
        args.tensor_parallel,
        args.bandwidth,
    )
    draft = (args.speculative_tokens, args.acceptance, args.draft_model)
    result = budget(d, args.batch, args.context, args.cached, draft)
    if args.json:
        print_json(result)
    else:
        print(render(result))
    return 0


def budget(d: Deployment, batch, context, cached=0, speculation=(0, None, None)) -> dict:
    """The `kvlab budget --json` object: the decode-step ledger, memory fit, the step's
    operators, and the TTFT of one request whose prompt is `context` tokens, `cached` of
    them served by a prefix hit. Under kernel tables a prompt outside the prefill tables
    gives `ttft_s: null` and says why in `notes` (the decode step itself must be inside
    them). `speculation` is (K drafted tokens, acceptance, draft model): with K > 0 the
    speculation round is added."""
    step = decode_step(d, batch, context)
    fit = memory_fit(d, batch, context)
    notes = list(step.notes)
    first = _first_token(d, context, cached, notes)
    spec = speculative_round(d, batch, context, *speculation)
    notes += [note for note in spec.pop("notes") if note not in notes]
    return {
        **step.to_dict(),
        "max_context": fit.to_dict()["max_context"],
        "cached_tokens": first["cached_tokens"],
        "ttft_s": first["ttft_s"],
        "prefill_flops": first["flops"],
        "prefill_bound": first["bound"],
        "operators": operator_rows(d, batch, context),
        **spec,
        "notes": notes,
    }


def _first_token(d: Deployment, context, cached, notes):
    """The prefill of one `context`-token prompt as a dict; under kernel tables a prompt
    outside them gets the ledger's prefill with `ttft_s: None`, and a note says why."""
    try:
        return prefill(d, max(context, 1), cached_tokens=cached).to_dict()
    except KvlabError as exc:
        if not d.kernel_tables:
            raise
        notes.append(f"TTFT not measured: {exc}")
        first = prefill(d.replace(speed=Ceiling()), max(context, 1), cached).to_dict()
        first["ttft_s"] = None
        return first


def speculative_round(
    d: Deployment, batch, context, speculative_tokens=0, acceptance=None, draft_model=None
) -> dict:
    """The speculation keys of the JSON: `tokens_per_verify_step` and `speculative_speedup`
    (1 without speculation), `speculative_breakeven_batch` (the batch where the speedup
    falls to 1; null when it pays at every batch), and `speculative` (the round's ledger
    with the verify pass's operators; null without speculation)."""
    k = speculative_tokens
    if not k:
        if acceptance is not None or draft_model is not None:
            raise KvlabError("--acceptance and --draft-model need --speculative-tokens K (K >= 1)")
        return {
            "tokens_per_verify_step": 1.0,
            "speculative_speedup": 1.0,
            "speculative_breakeven_batch": None,
            "speculative": None,
            "notes": [],
        }
    if acceptance is None:
        raise KvlabError(
            "--speculative-tokens needs --acceptance A: the probability that a "
            "drafted token is accepted (e.g. 0.7)"
        )
    s = speculative_step(d, batch, context, k, acceptance, draft_model)
    out = s.to_dict()
    out["operators"] = operator_rows(d, batch, context, speculative_tokens=s.speculative_tokens)
    knee = breakeven_batch(d, context, k, acceptance, draft_model)
    if knee is None:
        where = (
            "speculation pays at every batch up to the measured tables' edge"
            if d.kernel_tables
            else "speculation pays at every batch"
        )
    else:
        where = f"speculation stops paying at batch {knee:,} (speedup <= 1)"
    fit = (
        ""
        if knee is None or knee <= s.max_batch
        else f", beyond the {s.max_batch:,} sequences that fit"
    )
    return {
        "tokens_per_verify_step": s.tokens_per_verify_step,
        "speculative_speedup": s.speculative_speedup,
        "speculative_breakeven_batch": knee,
        "speculative": out,
        "notes": list(s.notes) + [where + fit],
    }


def render(r: dict) -> str:
    """The ledger as a short readable report."""

    total = r["step_bytes"]

    def share(x):
        return f"{100 * x / total:5.1f}%"

    fit = "fits" if r["fits"] else "does NOT fit"
    max_ctx = (
        "unbounded (sliding window)"
        if r["max_context"] is None
        else f"{int(r['max_context']):,} tokens"
    )
    measured = r["efficiency"] == "measured"
    how = "kernels timed from measured tables" if measured else f"x efficiency {r['efficiency']:g}"
    ttft = "not measured" if r["ttft_s"] is None else seconds(r["ttft_s"])
    lines = [
        f"kvlab budget: {r['model']} on {r['hardware']}, bandwidth "
        f"{si(r['bandwidth_bytes_per_s'], 'B/s')}"
        f" {how}",
        f"batch {int(r['batch']):,}, context {int(r['context']):,} tokens, weights "
        f"{r['weight_dtype']}, KV {r['kv_dtype']}",
        "",
        "bytes moved by one decode step",
        f"  weights read       {si(r['weight_read_bytes'], 'B'):>10}  "
        f"{share(r['weight_read_bytes'])}",
        f"  KV history read    {si(r['kv_read_bytes'], 'B'):>10}  {share(r['kv_read_bytes'])}"
        f"   ({si(r['kv_bytes_per_token'], 'B')} per token)",
        f"  KV written         {si(r['kv_write_bytes'], 'B'):>10}  {share(r['kv_write_bytes'])}",
        f"  total              {si(total, 'B'):>10}",
        "",
        f"time per step (TPOT) {seconds(r['step_time_s']):>10}  {r['bound']}-bound"
        f" (intensity {r['arithmetic_intensity']:.3g} FLOP/B, ridge "
        f"{r['ridge_flops_per_byte']:.3g})",
        f"  ceiling            {seconds(r['ceiling_step_time_s']):>10}  every operator at its own"
        f" max(bytes/bandwidth, FLOPs/peak)",
        f"  time from          {r['efficiency_source']}",
        f"throughput           {rate(r['tokens_per_s']):>10}  tokens/s in aggregate,"
        f" {rate(r['tokens_per_s_per_sequence'])} per sequence",
        f"first token (TTFT)   {ttft:>10}  prefill of a {int(r['context']):,}-token prompt,"
        f" {int(r['cached_tokens']):,} of them from the prefix cache ({r['prefill_bound']}-bound)",
        f"memory               {si(r['memory_needed_bytes'], 'B'):>10}  of"
        f" {si(r['capacity_bytes'], 'B')} usable: {fit};"
        f" max batch at this context {int(r['max_batch']):,}, max context at this batch {max_ctx}",
    ]
    if r["tensor_parallel"] > 1:
        latency = r["allreduce_latency_s"]
        lines.append(
            f"tensor parallel      {r['tensor_parallel']:>5} GPUs  all-reduces take"
            f" {seconds(r['allreduce_time_s'])} of the step ({seconds(latency)} latency,"
            f" {seconds(r['allreduce_time_s'] - latency)} moving data)"
        )
    if r["operators"]:
        lines += ["", _operators(r["operators"], measured)]
    if r["speculative"]:
        lines += [
            "",
            _speculative(r["speculative"], r["speculative_breakeven_batch"]),
            "",
            _operators(r["speculative"]["operators"], measured, "verify pass"),
        ]
    lines += [f"note: {note}" for note in r["notes"]]
    return "\n".join(lines)


def _speculative(s: dict, knee) -> str:
    """One speculation round against the plain decode step."""

    k, draft = s["speculative_tokens"], s["draft_model"] or "self-drafting heads"
    return "\n".join(
        [
            f"speculative decoding {k} drafted tokens, acceptance {s['acceptance']:g}:"
            f" {s['tokens_per_verify_step']:.3g} tokens per verify pass",
            f"  verify pass        {seconds(s['verify_step_time_s']):>10}  "
            f"{s['verify_bound']}-bound,"
            f" {si(s['verify_step_bytes'], 'B')} moved, {k + 1} positions per sequence",
            f"  drafting           {seconds(s['draft_time_s']):>10}  {k} x"
            f" {seconds(s['draft_step_time_s'])} ({draft})",
            f"  per token          {seconds(s['time_per_token_s']):>10}  {rate(s['tokens_per_s'])}"
            f" tokens/s in aggregate, {rate(s['tokens_per_s_per_sequence'])} per sequence:"
            f" {s['speculative_speedup']:.2f}x plain decode",
            f"  break-even batch   {'none' if knee is None else f'{knee:,}':>10}  where the speedup"
            " falls to 1",
            f"  memory             {si(s['memory_needed_bytes'], 'B'):>10}  with the draft and the"
            f" drafted tokens' KV: {'fits' if s['fits'] else 'does NOT fit'}; max batch"
            f" {int(s['max_batch']):,}",
        ]
    )


def _operators(rows: list[dict], measured: bool, what: str = "step") -> str:
    """The per-operator breakdown: launches, bytes, FLOPs, ceiling (and measured) time."""

    header = ["operator", "calls", "bytes", "FLOPs", "ceiling"]
    header += ["measured", "from"] if measured else []
    body = []
    for row in rows:
        cells = [
            row["name"],
            str(row["calls"]),
            si(row["bytes"], "B"),
            si(row["flops"], "FLOP"),
            seconds(row["ceiling_s"]),
        ]
        if measured:
            cells += [seconds(row["measured_s"]), row["how"].split(":", 1)[0]]
        body.append(cells)
    return f"operators of one {what} (all layers)\n" + table(body, header)
