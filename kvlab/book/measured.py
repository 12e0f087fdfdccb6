"""Chapter 2b, "Measured": every machine's recorded benchmarks against the ledger, and
the sentences the prose states about them (generated from whatever results are committed)."""
from __future__ import annotations

import numpy as np

from .. import fmt
from ..bench import report
from ..hardware import get_device
from ..models import get_model
from . import gpu_tables

#: Batches the attention figure follows, and the context the ledger figure uses.
ATTENTION_BATCHES = (1, 64)

def decode_summary(kernels: str = "default", kv_dtype: str = "bf16") -> str:
    """One sentence per machine for the chapter's prose: per batch, the range of the share of
    copy bandwidth the device-placement steps used over contexts 1K-32K and the ledger's
    largest error; '' when nothing is recorded."""
    out = []
    for t in report.targets(kernels=kernels):
        rows = [r for r in t["rows"] if r["kv_dtype"] == kv_dtype]
        if not rows:
            continue
        who = {"native": "kvlab's kernels", "torch": "PyTorch's kernels"}.get(t["kernels"], t["kernels"])
        parts = [f"at batch {r['batch']} the steps used at least {fmt.percent(r['fraction_of_bandwidth_min'])} "
                 f"of the copy bandwidth and the ledger was within {fmt.percent(r['max_abs_error'])}"
                 for r in rows]
        out.append(f"On {t['device_name']} with {who} ({kv_dtype} KV): " + "; ".join(parts) + ".")
    return " ".join(out)


#: A point counts as measured in a faster memory state when the copy bandwidth around it
#: exceeds the run's lowest by this factor (a shared VM's bandwidth jumps when neighbours idle).
FAST_STATE_RATIO = 1.25


def bandwidth_range() -> str:
    """'lo to hi': the copy bandwidth measured around the recorded decode points, all machines."""
    bws = [e["points"]["bandwidth_bytes_per_s"] for e in report.decode_comparison()]
    bws = [b[np.isfinite(b)] for b in bws]
    bws = [b for b in bws if len(b)]
    if not bws:
        return ""
    return f"{fmt.si(min(b.min() for b in bws), 'B/s')} to {fmt.si(max(b.max() for b in bws), 'B/s')}"


def kernels_notes() -> str:
    """How each recorded run with kvlab's kernels built them (compiler, instruction set)."""
    runs = report.decode_comparison("device")
    return "; ".join(sorted({e["kernels_note"] for e in runs if e["kernels"] == "native"}))


def pace_summary() -> str:
    """A sentence for the prose on who set the pace in the recorded runs (kvlab's kernels,
    device placement): the bandwidth range, and, where some points ran while the machine's
    memory was markedly faster, the share of it those steps used against the others'."""
    out = []
    for entry in report.decode_comparison("device"):
        p = entry["points"]
        bw, share = p["bandwidth_bytes_per_s"], p["fraction_of_bandwidth"]
        ok = np.isfinite(bw) & np.isfinite(share)
        if not ok.any():
            continue
        bw, share = bw[ok], share[ok]
        fast = bw > FAST_STATE_RATIO * bw.min()
        if not fast.any():
            out.append(f"In the recorded run on {entry['device_name']} the copy bandwidth around these steps "
                       f"stayed between {fmt.si(bw.min(), 'B/s')} and {fmt.si(bw.max(), 'B/s')}, and the cores kept "
                       "up with it; on a "
                       "machine with more bandwidth per core the arithmetic starts to show, and the third figure "
                       "below (each step's achieved bandwidth against the bandwidth around it) is where it would.")
        else:
            out.append(f"On {entry['device_name']} some steps ran while the copy bandwidth was up to "
                       f"{fmt.si(bw[fast].max(), 'B/s')} instead of {fmt.si(bw[~fast].min(), 'B/s')} to "
                       f"{fmt.si(bw[~fast].max(), 'B/s')}: those used {fmt.percent(share[fast].min())} to "
                       f"{fmt.percent(share[fast].max())} of it, the others {fmt.percent(share[~fast].min())} to "
                       f"{fmt.percent(share[~fast].max())}. There the cores, not the memory, set the pace; the third "
                       "figure below shows each step's achieved bandwidth against the bandwidth around it.")
    return " ".join(out)



def gpu_status() -> str:
    gpus = sorted({m["device_name"] for m in report.machines().values() if str(m["device"]).startswith("cuda")})
    if gpus:
        return "GPUs recorded: " + ", ".join(gpus) + "."
    return ("No GPU has been recorded yet: the figures show this CPU only until someone runs `make bench-gpu` on a "
            "GPU box and commits its results.")


def crossover_findings() -> str:
    """Where recompute and fetch cross on each recorded machine, as a sentence."""
    findings = []
    for c in report.recompute_curves():
        where = f"{c['device_name']} ({c['preset']})"
        if c["crossover_tokens"]:
            findings.append(f"on {where} the curves cross at {fmt.fixed(c['crossover_tokens'], 0)} tokens: where the "
                            "fetch curve lies above the recompute curve, a prefix hit served from host memory is a "
                            "liability")
        elif c["tokens"] is not None and c["fetch_s"][-1] < c["recompute_s"][-1]:
            findings.append(f"on {where} fetching is faster than recomputing at every measured length: host memory "
                            "sits close to this CPU, which is why the liability appears behind a PCIe link")
        else:
            findings.append(f"on {where} recomputing is faster at every measured length")
    return "; ".join(findings) or "no results recorded yet"


def numbers() -> dict[str, str]:
    return {**gpu_numbers(), **cpu_numbers()}


def cpu_numbers() -> dict[str, str]:
    machines = report.machines()
    rows = [r for t in report.targets() for r in t["rows"]]
    mem = report.memory_bandwidth()
    return {
        "machines": ", ".join(sorted({m["device_name"] or name for name, m in machines.items()})) or "none yet",
        "gpu_status": gpu_status(),
        "worst_error": fmt.percent(max(r["max_abs_error"] for r in rows)) if rows else "n/a",
        "worst_share": fmt.percent(min(r["fraction_of_bandwidth_min"] for r in rows)) if rows else "n/a",
        "decode_summary": decode_summary() or "No decode results are recorded yet.",
        "int8_summary": decode_summary(kv_dtype="int8") or "No int8 results are recorded yet.",
        "torch_summary": decode_summary("torch") or
        "no comparison run with PyTorch's kernels is recorded yet (`make bench` records one)",
        "bracket_bw": bandwidth_range() or "n/a",
        "pace_note": pace_summary() or "No decode results are recorded yet.",
        "kernels_note": kernels_notes() or "no run with kvlab's kernels is recorded yet",
        "copy_bw": "; ".join(f"{m['device_name']}: {fmt.si(m['bandwidth_bytes_per_s'], 'B/s')}" for m in mem) or "n/a",
        "crossover": crossover_findings(),
    }


# ------------------------------------------------------------------ real GPUs

def _names() -> dict[str, str]:
    return {d: get_device(d).display_name for d in gpu_tables.gpus()}


def _sources() -> list[str]:
    """One line per framework version: which GPUs' tables it measured, and the package."""
    from ..measured import load

    by_version: dict[str, list[str]] = {}
    for d in gpu_tables.gpus():
        t = load(d)
        by_version.setdefault(f"{t.framework} {t.framework_version}", []).append(t.device_string)
    package = load(gpu_tables.gpus()[0]).raw["package"]
    return [f"{version} kernel tables ({package}): {', '.join(devices)}" for version, devices in by_version.items()]


def gemv_figure():
    from ..viz import gpu_figures

    return gpu_figures.gemv_band_figure([gpu_tables.gemv_band(d) for d in gpu_tables.gpus()], _names(), _sources())


def gemm_batch_figure():
    from ..viz import gpu_figures

    return gpu_figures.gemm_batch_figure([gpu_tables.gemm_over_batch(d) for d in gpu_tables.gpus()], _names(),
                                         _sources(), gpu_tables.BATCH_GEMM_NK)


def attention_figure():
    from ..viz import gpu_figures

    curves = [gpu_tables.attention_over_context(d, b) for d in gpu_tables.gpus() for b in ATTENTION_BATCHES]
    return gpu_figures.attention_figure(curves, _names(), _sources(), gpu_tables.ATTENTION_LAYOUT)


def ledger_figure():
    from ..viz import gpu_figures

    curves = [gpu_tables.ledger_against_kernels(d) for d in gpu_tables.gpus()]
    return gpu_figures.ledger_figure(curves, _names(), _sources(), get_model(curves[0]["model"]).display_name)


def _listing(values: dict[str, str]) -> str:
    """'A 79%, B 74% and C 76%'."""
    items = [f"{name} {value}" for name, value in values.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def gpu_numbers() -> dict[str, str]:
    names, gpus = _names(), gpu_tables.gpus()
    bands = {d: gpu_tables.gemv_band(d) for d in gpus}
    in_sheet = [d for d in gpus if bands[d]["median_large_fraction"] <= 1]
    above = [d for d in gpus if d not in in_sheet]
    attention = {d: gpu_tables.attention_over_context(d, ATTENTION_BATCHES[-1]) for d in gpus}
    impossible = [d for d in gpus if attention[d]["fraction_of_sheet"].max() > 1]
    ledger = {d: gpu_tables.ledger_against_kernels(d) for d in gpus}
    gemm = {d: gpu_tables.gemm_over_batch(d) for d in gpus}
    h100 = "h100-sxm"
    return {
        "gpu_list": _listing({names[d]: f"({load_version(d)})" for d in gpus}),
        "gemv_shares": _listing({names[d]: fmt.percent(_derived(d)["gemv_fraction_of_sheet"]) for d in in_sheet}),
        "gemv_above": _listing({names[d]: fmt.percent(_derived(d)["gemv_fraction_of_sheet"]) for d in above})
        or "none",
        "gemv_how": _derived(h100)["gemv_how"],
        "gemm_m1_h100": fmt.percent(float(gemm[h100]["efficiency"][0])),
        "gemm_best_h100": fmt.percent(float(np.max(gemm[h100]["efficiency"]))),
        "attn_best_h100": fmt.percent(float(attention[h100]["fraction_of_sheet"].max())),
        "attn_impossible": _listing({names[d]: fmt.percent(float(attention[d]["fraction_of_sheet"].max()))
                                     for d in impossible}) or "none",
        "ledger_b1": _listing({names[d]: f"{fmt.sig(float(ledger[d]['ratio'][0]), 3)}×" for d in gpus}),
        "ledger_h100_b1": f"{fmt.sig(float(ledger[h100]['ratio'][0]), 3)}×",
        "ledger_h100_last": f"{fmt.sig(float(ledger[h100]['ratio'][-1]), 3)}×",
        "ledger_h100_last_batch": fmt.fixed(int(ledger[h100]["batch"][-1]), 0),
        "ledger_model": get_model(ledger[h100]["model"]).display_name,
        "ledger_context": fmt.fixed(ledger[h100]["context"], 0),
        "overhead_h100": fmt.seconds(float(np.asarray(_step(h100).overhead_s))),
    }


def _derived(device: str) -> dict:
    """Figures the extract derived from the whole source tables (kvlab/data/measured)."""
    from ..measured import load

    return load(device).raw["derived"]


def load_version(device: str) -> str:
    from ..measured import load

    t = load(device)
    return f"{t.framework} {t.framework_version}"


def _step(device: str):
    from .. import cost

    return cost.decode_step("llama-3.1-8b", device, 1, 4096, "bf16", "bf16", efficiency="measured")
