"""`kvlab simulate`: replay a trace on a simulated cluster and report latency, throughput, SLOs.

JSON contract (always present): ttft_p50_s, ttft_p90_s, tpot_p50_s, itl_p99_s,
throughput_tokens_per_s, requests_completed, prefix_hit_ratio; plus the other
percentiles, SLO attainment and goodput, preemptions and swapped bytes, bytes moved per
link, move time exposed on the critical path vs hidden behind compute, rejected requests
(too large, or rejected early), where the step times came from (`efficiency_source`; with
`--efficiency measured`, `steps_priced_outside_tables` of `steps_priced` fell beyond the
kernel tables), and the resolved config. The flags are SimConfig's fields
(kvlab/sim/config.py holds every default and help text). Identical runs print identical
JSON; `--timing` adds the run's wall time.

`--warmup S` replays the S seconds of trace before the measured slice first (caches fill,
the cluster loads up) and leaves them out of every figure (`requests_warmup` counts
them); without `--start` the slice starts S seconds in. `--rate-scale F` replays the
slice F times as fast.

`--saturation` prints another object instead (kvlab.sim.saturation.Saturation.to_dict):
saturation_requests_per_s (the highest mean request rate at which `--attainment` of the
requests meet both SLOs, bisected to `--tolerance`; the mean over samples),
saturation_spread_requests_per_s (the largest distance of a sample from that mean),
saturation_requests_per_s_per_gpu, saturation_samples_requests_per_s, saturation_status,
samples, runs, the SLOs, the config, and at_saturation (the summary above for the first
sample at its saturation rate). Samples: `--seeds K` seeds of a generated workload, or K
consecutive slices of a recorded trace.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from ..errors import KvlabError, check_number
from ..fmt import seconds, si
from ..sim import SimConfig, measured_rate_per_s, scale_arrivals, simulate, trace_slice
from ..sim.saturation import (
    DEFAULT_ATTAINMENT,
    DEFAULT_REL_TOL,
    is_generated_spec,
    saturation,
    seed_samples,
    slice_samples,
)
from .args import count, number, print_json
from .budget import efficiency


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a trace on a colocated, disaggregated or KV-centric cluster (discrete-event)",
        description="Replay a request trace on a simulated GPU cluster whose step times come from "
        "the ledger, and report TTFT / TPOT / ITL percentiles, throughput, SLO attainment and "
        "goodput, prefix hits, preemptions and the bytes each link moved (on the critical path or "
        "hidden behind compute). "
        "Colocated uses prefill-workers + decode-workers GPUs that do both.",
    )
    p.add_argument(
        "trace",
        metavar="TRACE",
        help="a known trace (conversation, synthetic), generated[:PRESET][:SEED], "
        "poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S][,shared=F][,prefix=T]"
        "[,prefixes=M] (P, O: a number of tokens or lognormal(mean,sigma), exponential(mean), "
        "normal(mean,std), uniform(low,high); shared/prefix: each prompt opens with F of its "
        "tokens, at most T, from a pool of M common prefixes), or a .jsonl path",
    )
    add_config_flags(p, SimConfig)
    p.add_argument(
        "--start",
        type=number,
        metavar="S",
        help="slice: seconds into the trace (default 0, or --warmup's seconds)",
    )
    p.add_argument(
        "--duration",
        type=number,
        metavar="S",
        help="slice: seconds of arrivals to replay (default all)",
    )
    p.add_argument("--limit", type=count, metavar="N", help="slice: at most N requests")
    p.add_argument(
        "--warmup",
        type=number,
        default=0.0,
        metavar="S",
        help="replay the S seconds of trace before the slice first, unmeasured (caches fill); "
        "without --start the slice starts S seconds in (default 0)",
    )
    p.add_argument(
        "--rate-scale",
        type=number,
        metavar="F",
        help="replay the slice F times as fast (its gaps divided by F; default 1); with "
        "--saturation: where the search starts",
    )
    p.add_argument(
        "--saturation",
        action="store_true",
        help="find the highest request rate at which --attainment of the requests meet both "
        "SLOs (bracket, then bisect the rate scale) and print it with its spread",
    )
    p.add_argument(
        "--attainment",
        type=number,
        metavar="F",
        help="with --saturation: the share of requests that must meet both SLOs (default 0.9, "
        "DistServe's goal)",
    )
    p.add_argument(
        "--seeds",
        type=count,
        metavar="K",
        help="with --saturation: K seeds of a generated workload, or K consecutive slices of a "
        "recorded trace (default 1)",
    )
    p.add_argument(
        "--tolerance",
        type=number,
        metavar="F",
        help="with --saturation: stop bisecting when the bracket is within F of its top "
        "(default 0.025, Sarathi-Serve's)",
    )
    p.add_argument(
        "--records", metavar="PATH", help="also write per-request records (.csv or .jsonl)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (the same bytes for the same run)",
    )
    p.add_argument(
        "--timing", action="store_true", help="with --json, add the run's wall time (wall_s)"
    )
    p.set_defaults(func=run)


_KINDS = {"count": count, "number": number, "efficiency": efficiency}


def _default_text(value) -> str:
    value = getattr(value, "label", value)  # a speed: its number or word
    if isinstance(value, bool) or value is None:
        return ""
    return f" (default {value:g})" if isinstance(value, float) else f" (default {value})"


def add_config_flags(parser, config_class) -> None:
    """One flag per field of `config_class`, from the field's metadata (help, flag, kind,
    choices, metavar, required). Unset flags stay out of the namespace, so the dataclass's
    defaults are the only defaults."""

    for f in dataclasses.fields(config_class):
        meta = f.metadata
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        kind = meta.get("kind")
        if kind == "flag":
            parser.add_argument(
                flag, dest=f.name, action="store_true", default=argparse.SUPPRESS, help=meta["help"]
            )
            continue
        if kind == "tristate":
            group = parser.add_mutually_exclusive_group()
            group.add_argument(
                flag, dest=f.name, action="store_true", default=argparse.SUPPRESS, help=meta["help"]
            )
            group.add_argument(
                "--no-" + flag[2:],
                dest=f.name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=f"the opposite of {flag}",
            )
            continue
        kwargs = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "metavar": meta.get("metavar"),
            "help": meta["help"] + ("" if meta.get("required") else _default_text(f.default)),
        }
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
            kwargs.pop("metavar")
        if kind:
            kwargs["type"] = _KINDS[kind]
        if meta.get("required"):
            kwargs["required"] = True
        parser.add_argument(flag, **kwargs)


def run(args) -> int:
    names = [f.name for f in dataclasses.fields(SimConfig)]
    config = SimConfig(**{name: getattr(args, name) for name in names if hasattr(args, name)})
    if args.records:
        check_records_path(args.records)
    if not args.saturation:
        for flag in ("attainment", "seeds", "tolerance"):
            if getattr(args, flag) is not None:
                raise KvlabError(f"--{flag} applies to --saturation only")
    elif args.records:
        raise KvlabError("--records writes one run's requests; --saturation runs many")
    start = args.start if args.start is not None else args.warmup
    if args.saturation:
        return _run_saturation(args, config, start)
    trace = trace_slice(args.trace, start, args.duration, args.limit, args.warmup)
    if args.rate_scale is not None:
        trace = scale_arrivals(trace, args.rate_scale)
    progress = _progress if sys.stderr.isatty() and len(trace) > 2000 else None
    result = simulate(trace, config, progress=progress)
    if progress:
        sys.stderr.write("\n")
    if args.records:
        write_records(result, args.records)
    return _emit(args, result.to_dict(), result.wall_s, render)


def _emit(args, out: dict, wall_s: float, render_text) -> int:
    """Print a result as one JSON object (its wall time too under --timing) or as text."""
    if args.json:
        if args.timing:
            out["wall_s"] = wall_s
        print_json(out)
    else:
        print(render_text(out, wall_s))
    return 0


def _run_saturation(args, config, start: float) -> int:
    k = 1 if args.seeds is None else args.seeds
    if is_generated_spec(args.trace):
        samples = [
            trace_slice(t, start, args.duration, args.limit, args.warmup)
            for t in seed_samples(args.trace, k)
        ]
    else:
        samples = slice_samples(args.trace, k, start, args.duration, args.limit, args.warmup)
    first_rate = None
    if args.rate_scale is not None:
        check_number("--rate-scale", args.rate_scale, maximum=1e9)
        first_rate = measured_rate_per_s(samples[0]) * args.rate_scale
    found = saturation(
        config,
        samples,
        attainment=DEFAULT_ATTAINMENT if args.attainment is None else args.attainment,
        rel_tol=DEFAULT_REL_TOL if args.tolerance is None else args.tolerance,
        start_rate_per_s=first_rate,
    )
    out = found.to_dict()
    out["trace"] = samples[0].label
    out["generated"] = samples[0].generated
    return _emit(args, out, found.wall_s, render_saturation)


def render_saturation(r: dict, wall_s: float | None = None) -> str:
    """A saturation search as a short readable report."""

    n = len(r["samples"])
    per = "; ".join(
        f"{rate:.3g} ({status})"
        for rate, status in zip(
            r["saturation_samples_requests_per_s"], r["saturation_status"], strict=True
        )
    )
    lines = [
        f"kvlab simulate --saturation: {r['arch']} ({r['gpus']} GPUs, {r['hardware']}, "
        f"{r['model']})",
        f"  {100 * r['attainment_target']:g}% of requests within TTFT <= "
        f"{seconds(r['ttft_slo_s'])} and {r['tbt_stat']} gap <= {seconds(r['tbt_slo_s'])}",
        f"  saturation {r['saturation_requests_per_s']:.3g} +- "
        f"{r['saturation_spread_requests_per_s']:.2g} requests/s "
        f"({r['saturation_requests_per_s_per_gpu']:.3g} per GPU) over {n} "
        f"sample{'s' if n > 1 else ''}: {per}",
        f"  {r['runs']} runs, bisected to {100 * r['tolerance']:g}%"
        + (f", in {seconds(wall_s)} of wall time" if wall_s is not None else ""),
    ]
    lines += [f"    {label}" for label in r["samples"]]
    return "\n".join(lines)


def _progress(done: int, total: int) -> None:
    sys.stderr.write(f"\rkvlab simulate: {done:,}/{total:,} requests done")
    sys.stderr.flush()


def check_records_path(path: str):
    """Refuse a records path that cannot be written before a long run, not after it: the
    folder must exist and take a new file (one is created and removed), and the name must
    fit the file system."""

    target = Path(path)
    if target.suffix not in (".csv", ".jsonl"):
        raise KvlabError(f"--records {path!r}: name a .csv or .jsonl file")
    try:
        if target.is_dir():
            raise KvlabError(
                f"--records {path!r} is a folder; name a .csv or .jsonl file inside it"
            )
        parent_is_dir = target.parent.is_dir()
    except OSError as exc:
        raise KvlabError(f"--records {path!r}: {exc.strerror or exc}") from None
    if not parent_is_dir:
        raise KvlabError(f"--records {path!r}: {_missing_folder(target.parent)}")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise KvlabError(f"--records {path!r}: folder {str(target.parent)!r} is not writable")
    try:
        limit = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(target.name)) > limit:
        raise KvlabError(
            f"--records {path!r}: the file name is too long for this file system (at most "
            f"{limit} bytes)"
        )
    try:
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=".kvlab-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise KvlabError(
            f"--records {path!r}: cannot create a file there ({exc.strerror or exc})"
        ) from None
    return target


def _missing_folder(folder) -> str:
    """Why `folder` cannot hold a file: the first part of it that is a file, or missing."""
    for part in [folder, *folder.parents]:
        try:
            if part.exists():
                if not part.is_dir():
                    return f"{str(part)!r} is a file, not a folder"
                break
        except OSError:
            break
    return f"folder {str(folder)!r} does not exist"


def _file_mode() -> int:
    """The mode a new file gets from open(): 0666 less the umask (0644 with the usual 022)."""

    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_records(result, path: str) -> None:
    """Per-request records to .csv or .jsonl, atomically (a temp file renamed into place)."""

    target = check_records_path(path)
    rows = result.records_table()
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".kvlab-records-", suffix=".tmp")
    except OSError as exc:
        raise KvlabError(
            f"--records {path!r}: cannot write there ({exc.strerror or exc})"
        ) from None
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "w", newline="") as handle:
            if target.suffix == ".csv":
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
                writer.writeheader()
                writer.writerows(rows)
            else:
                for row in rows:
                    handle.write(json.dumps(row) + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        os.unlink(tmp)
        raise KvlabError(
            f"--records {path!r}: cannot write there ({exc.strerror or exc})"
        ) from None
    except BaseException:
        os.unlink(tmp)
        raise


def render(r: dict, wall_s: float | None = None) -> str:
    """The run as a short readable report."""

    def s(x):
        return "-" if x is None else seconds(x)

    cfg = r["config"]
    tp = cfg.get("tensor_parallel", 1)
    unit = "GPUs" if tp == 1 else f"instances of {tp} GPUs (tensor parallel)"
    gpus = (
        f"{r['prefill_workers'] + r['decode_workers']} {unit} doing both"
        if r["arch"] == "colocated"
        else f"{r['prefill_workers']} prefill + {r['decode_workers']} decode {unit}"
    )
    budget = f"{cfg['chunk_tokens']:,}-token budget" if cfg["chunk_tokens"] else "no token budget"
    lines = [
        f"kvlab simulate: {r['trace']} on {r['arch']} ({gpus}, {r['hardware']}, {r['model']})",
        f"  link {r['link']}, prefix cache {r['prefix_cache']} "
        f"({cfg['prefill_router']} prefill router, "
        f"{cfg['decode_router']} decode router), overlap {'on' if r['overlap'] else 'off'}"
        + (", KV REMOTE during decode" if r["remote_kv"] else ""),
        f"  {cfg['scheduler']} scheduler ({budget}"
        + ("" if r["arch"] == "colocated" else f"; on {r['scheduler_scope']} only")
        + f"), {cfg['preemption']} on preemption"
        + (", early rejection" if cfg["early_reject"] else ""),
        f"  step times from {r['efficiency_source']}" + _outside(r),
        f"  requests {r['requests']:,}: {r['requests_completed']:,} done, "
        + (
            f"{r['requests_rejected_too_long']:,} rejected as longer than the model's context, "
            if r["requests_rejected_too_long"]
            else ""
        )
        + f"{r['requests_rejected_too_large']:,} rejected as too large for a GPU, "
        f"{r['requests_rejected_early']:,} rejected early; {r['tokens_generated']:,} tokens in "
        f"{s(r['duration_s'])}",
        "",
        "              p50        p90        p99       mean",
    ]
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        lines.append(
            f"  {name.upper():<6}"
            + "".join(f"{s(r.get(f'{name}_{q}_s')):>11}" for q in ("p50", "p90", "p99", "mean"))
        )
    lines += _render_totals(r, s)
    if r["rejected"]:
        more = f" (and {len(r['rejected']) - 1} more)" if len(r["rejected"]) > 1 else ""
        lines += ["", f"  rejected: {r['rejected'][0]['reason']}{more}"]
    wall = f" in {s(wall_s)} of wall time" if wall_s is not None else ""
    lines += ["", f"  simulated {s(r['sim_end_s'])}{wall} ({r['events']:,} events)"]
    return "\n".join(lines)


def _outside(r: dict) -> str:
    """How many step prices fell beyond the measured tables (measured mode only)."""
    if not r["steps_priced_outside_tables"]:
        return ""
    return (
        f"\n    ({r['steps_priced_outside_tables']:,} of {r['steps_priced']:,} step prices lie "
        "beyond the tables: held at the efficiency of the nearest size measured)"
    )


def _render_totals(r: dict, s) -> list[str]:
    lines = [
        "",
        f"  throughput        {r['throughput_tokens_per_s'] or 0:,.0f} tokens/s",
        f"  SLO (TTFT <= {s(r['ttft_slo_s'])}, {r['tbt_stat']} gap <= {s(r['tbt_slo_s'])}): "
        f"{100 * (r['slo_attainment'] or 0):.1f}% of requests; goodput "
        f"{r['goodput_requests_per_s'] or 0:,.2f} requests/s, "
        f"{r['goodput_tokens_per_s'] or 0:,.0f} tokens/s",
        f"  prefix cache      {100 * r['prefix_hit_ratio']:.1f}% of prompt tokens served from "
        "cache",
        f"  preemptions       {r['preemptions']:,} of {r['requests_preempted']:,} requests"
        + (f", {si(r['swapped_bytes'], 'B')} swapped" if r["swapped_bytes"] else ""),
        "",
        "  moved                 bytes   on critical path   hidden behind compute",
    ]
    for purpose, v in r["network"]["by_purpose"].items():
        if v["moves"]:
            lines.append(
                f"  {purpose:<19}{si(v['bytes'], 'B'):>10}   {s(v['exposed_s']):>12}   "
                f"{s(v['hidden_s']):>14}   ({v['link']})"
            )
    return lines
