"""Chapter 2b, "Measured": every machine's recorded benchmarks against the ledger, and
the sentences the prose states about them (generated from whatever results are committed)."""

from __future__ import annotations

import numpy as np

from .. import cost, fmt
from ..bench import report
from ..deployment import Deployment, KernelTables
from ..hardware import get_device
from ..kernel_tables import load
from ..models import get_model
from ..viz import i18n
from . import gpu_tables
from .lang import clauses, join, pick, sentences

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
        who = {
            "native": pick("kvlab's kernels", "kvlab 的内核"),
            "torch": pick("PyTorch's kernels", "PyTorch 的内核"),
        }.get(t["kernels"], t["kernels"])
        parts = [
            pick(
                f"at batch {r['batch']} the steps used at least "
                f"{fmt.percent(r['fraction_of_bandwidth_min'])} of the copy bandwidth and the "
                f"ledger was within {fmt.percent(r['max_abs_error'])}",
                f"批大小 {r['batch']} 时，解码步至少用到拷贝带宽的 "
                f"{fmt.percent(r['fraction_of_bandwidth_min'])}，账本误差在 "
                f"{fmt.percent(r['max_abs_error'])} 以内",
            )
            for r in rows
        ]
        out.append(
            pick(
                f"On {t['device_name']} with {who} ({kv_dtype} KV): ",
                f"在 {t['device_name']} 上用 {who}（{kv_dtype} KV）：",
            )
            + clauses(parts)
            + pick(".", "。")
        )
    return sentences(out)


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
    low, high = fmt.si(min(b.min() for b in bws), "B/s"), fmt.si(max(b.max() for b in bws), "B/s")
    return pick(f"{low} to {high}", f"{low} 至 {high}")


def kernels_notes() -> str:
    """How each recorded run with kvlab's kernels built them (compiler, instruction set)."""
    runs = report.decode_comparison("device")
    notes = sorted({e["kernels_note"] for e in runs if e["kernels"] == "native"})
    return clauses(_kernels_note(note) for note in notes)


def _kernels_note(note: str) -> str:
    """'native C kernels (<isa>, <compiler>)' (kvlab.native's wording) in the edition's
    language; the instruction sets and the compiler's own version line stay as recorded."""
    head = "native C kernels ("
    if not (note.startswith(head) and note.endswith(")")):
        return note
    return pick(note, f"原生 C 内核（{note[len(head) : -1]}）")


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
        name = entry["device_name"]
        if not fast.any():
            low, high = fmt.si(bw.min(), "B/s"), fmt.si(bw.max(), "B/s")
            out.append(
                pick(
                    f"In the recorded run on {name} the copy bandwidth around these steps "
                    f"stayed between {low} and {high}, and the cores kept up with it; on a "
                    "machine with more bandwidth per core the arithmetic starts to show, and the "
                    "third figure below (each step's achieved bandwidth against the bandwidth "
                    "around it) is where it would.",
                    f"在 {name} 的记录中，这些解码步前后的拷贝带宽保持在 {low} 到 {high} 之间，"
                    "核心跟得上；在每核带宽更高的机器上，计算开销就会显现出来，"
                    "下面第三张图（每步实际带宽对比其前后的带宽）就是它会出现的地方。",
                )
            )
        else:
            top, low, high = (
                fmt.si(bw[fast].max(), "B/s"),
                fmt.si(bw[~fast].min(), "B/s"),
                fmt.si(bw[~fast].max(), "B/s"),
            )
            fast_lo, fast_hi = fmt.percent(share[fast].min()), fmt.percent(share[fast].max())
            slow_lo, slow_hi = fmt.percent(share[~fast].min()), fmt.percent(share[~fast].max())
            out.append(
                pick(
                    f"On {name} some steps ran while the copy bandwidth was up to "
                    f"{top} instead of {low} to {high}: those used {fast_lo} to {fast_hi} of it, "
                    f"the others {slow_lo} to {slow_hi}. There the cores, not the memory, set the "
                    "pace; the third figure below shows each step's achieved bandwidth against "
                    "the bandwidth around it.",
                    f"在 {name} 上，有些解码步运行时拷贝带宽高达 {top}，而平时是 {low} 到 {high}："
                    f"这些步只用到其中的 {fast_lo} 到 {fast_hi}，"
                    f"其余步则是 {slow_lo} 到 {slow_hi}。"
                    "这时定节奏的是核心，而不是内存；下面第三张图画出了每步实际带宽与其前后带宽的对比。",
                )
            )
    return sentences(out)


def gpu_status() -> str:
    gpus = sorted(
        {
            m["device_name"]
            for m in report.machines().values()
            if str(m["device"]).startswith("cuda")
        }
    )
    if gpus:
        return pick("GPUs recorded: " + join(gpus) + ".", "已记录的 GPU：" + join(gpus) + "。")
    return pick(
        "No GPU has been recorded yet: the figures show this CPU only until someone runs "
        "`make bench-gpu` on a GPU box and commits its results.",
        "还没有记录任何 GPU：在有人到 GPU 机器上运行 `make bench-gpu` 并提交结果之前，"
        "图中只有这台 CPU。",
    )


def crossover_findings() -> str:
    """Where recompute and fetch cross on each recorded machine, as a sentence."""
    findings = []
    for c in report.recompute_curves():
        where = f"{c['device_name']} ({c['preset']})"
        if c["crossover_tokens"]:
            tokens = fmt.fixed(c["crossover_tokens"], 0)
            findings.append(
                pick(
                    f"on {where} the curves cross at {tokens} tokens: where the "
                    "fetch curve lies above the recompute curve, a prefix hit served from host "
                    "memory is a liability",
                    f"在 {where} 上，两条曲线在 {tokens} 个 token 处相交："
                    "取回曲线高于重算曲线的地方，"
                    "从主机内存提供的前缀命中反而是负担",
                )
            )
        elif c["tokens"] is not None and c["fetch_s"][-1] < c["recompute_s"][-1]:
            findings.append(
                pick(
                    f"on {where} fetching is faster than recomputing at every measured length: "
                    "host memory sits close to this CPU, which is why the liability appears "
                    "behind a PCIe link",
                    f"在 {where} 上，每个测过的长度都是取回比重算快：主机内存就在这颗 CPU 旁边，"
                    "所以这种负担要隔着一条 PCIe 链路才会出现",
                )
            )
        else:
            findings.append(
                pick(
                    f"on {where} recomputing is faster at every measured length",
                    f"在 {where} 上，每个测过的长度都是重算更快",
                )
            )
    return clauses(findings) or pick("no results recorded yet", "尚无记录的结果")


def numbers() -> dict[str, str]:
    return {**gpu_numbers(), **cpu_numbers()}


def cpu_numbers() -> dict[str, str]:
    machines = report.machines()
    rows = [r for t in report.targets() for r in t["rows"]]
    mem = report.memory_bandwidth()
    return {
        "machines": join(sorted({m["device_name"] or name for name, m in machines.items()}))
        or pick("none yet", "暂无"),
        "gpu_status": gpu_status(),
        "worst_error": fmt.percent(max(r["max_abs_error"] for r in rows)) if rows else _na(),
        "worst_share": fmt.percent(min(r["fraction_of_bandwidth_min"] for r in rows))
        if rows
        else _na(),
        "decode_summary": decode_summary() or _no_decode(),
        "int8_summary": decode_summary(kv_dtype="int8")
        or pick("No int8 results are recorded yet.", "尚未记录 int8 的结果。"),
        "torch_summary": decode_summary("torch")
        or pick(
            "No comparison run with PyTorch's kernels is recorded yet (`make bench` records one).",
            "尚未记录与 PyTorch 内核的对比运行（`make bench` 会记录一次）。",
        ),
        "bracket_bw": bandwidth_range() or _na(),
        "pace_note": pace_summary() or _no_decode(),
        "kernels_note": kernels_notes()
        or pick(
            "none of them yet (no run with kvlab's kernels is recorded)",
            "尚无使用 kvlab 内核的运行",
        ),
        "copy_bw": clauses(
            pick(f"{m['device_name']}: ", f"{m['device_name']}：")
            + fmt.si(m["bandwidth_bytes_per_s"], "B/s")
            for m in mem
        )
        or _na(),
        "crossover": crossover_findings(),
    }


# ------------------------------------------------------------------ real GPUs


def _names() -> dict[str, str]:
    return {d: get_device(d).display_name for d in gpu_tables.gpus()}


def _sources() -> list[str]:
    """One line per framework version: which GPUs' tables it measured, and the package."""
    by_version: dict[str, list[str]] = {}
    for d in gpu_tables.gpus():
        t = load(d)
        by_version.setdefault(f"{t.framework} {t.framework_version}", []).append(t.device_string)
    package = load(gpu_tables.gpus()[0]).raw["package"]
    return [
        f"{version} kernel tables ({package}): {', '.join(devices)}"
        for version, devices in by_version.items()
    ]


def gemv_figure():
    from ..viz import measured as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.gemv_band_figure(
        [gpu_tables.gemv_band(d) for d in gpu_tables.gpus()], _names(), _sources()
    )


def gemm_batch_figure():
    from ..viz import measured as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.gemm_batch_figure(
        [gpu_tables.gemm_over_batch(d) for d in gpu_tables.gpus()],
        _names(),
        _sources(),
        gpu_tables.BATCH_GEMM_NK,
    )


def attention_figure():
    from ..viz import measured as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    curves = [
        gpu_tables.attention_over_context(d, b)
        for d in gpu_tables.gpus()
        for b in ATTENTION_BATCHES
    ]
    return figures.attention_figure(curves, _names(), _sources(), gpu_tables.ATTENTION_LAYOUT)


def ledger_figure():
    from ..viz import measured as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    curves = [gpu_tables.ledger_against_kernels(d) for d in gpu_tables.gpus()]
    return figures.ledger_figure(
        curves, _names(), _sources(), get_model(curves[0]["model"]).display_name
    )


def _listing(values: dict[str, str]) -> str:
    """'A 79%, B 74% and C 76%' ('A 79%、B 74% 和 C 76%' in Chinese)."""
    return join(f"{name} {value}" for name, value in values.items())


def _na() -> str:
    return pick("n/a", "无")


def _no_decode() -> str:
    return pick("No decode results are recorded yet.", "尚未记录解码结果。")


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
        "gemv_shares": _listing(
            {names[d]: fmt.percent(_derived(d)["gemv_fraction_of_sheet"]) for d in in_sheet}
        ),
        "gemv_above": _listing(
            {names[d]: fmt.percent(_derived(d)["gemv_fraction_of_sheet"]) for d in above}
        )
        or pick("none", "无"),
        # the extract's sentence (kvlab.kernel_tables)
        "gemv_how": i18n.t(_derived(h100)["gemv_how"]),
        "gemm_m1_h100": fmt.percent(float(gemm[h100]["efficiency"][0])),
        "gemm_best_h100": fmt.percent(float(np.max(gemm[h100]["efficiency"]))),
        "attn_best_h100": fmt.percent(float(attention[h100]["fraction_of_sheet"].max())),
        "attn_impossible": _listing(
            {
                names[d]: fmt.percent(float(attention[d]["fraction_of_sheet"].max()))
                for d in impossible
            }
        )
        or pick("none", "无"),
        "ledger_b1": _listing(
            {names[d]: f"{fmt.sig(float(ledger[d]['ratio'][0]), 3)}×" for d in gpus}
        ),
        "ledger_h100_b1": f"{fmt.sig(float(ledger[h100]['ratio'][0]), 3)}×",
        "ledger_h100_last": f"{fmt.sig(float(ledger[h100]['ratio'][-1]), 3)}×",
        "ledger_h100_last_batch": fmt.fixed(int(ledger[h100]["batch"][-1]), 0),
        "ledger_model": get_model(ledger[h100]["model"]).display_name,
        "ledger_context": fmt.fixed(ledger[h100]["context"], 0),
        "overhead_h100": fmt.seconds(float(np.asarray(_step(h100).overhead_s))),
    }


def _derived(device: str) -> dict:
    """Figures the extract derived from the whole source tables (kvlab/data/kernel_tables)."""
    return load(device).raw["derived"]


def load_version(device: str) -> str:
    t = load(device)
    return f"{t.framework} {t.framework_version}"


def _step(device: str):
    d = Deployment("llama-3.1-8b", device, "bf16", "bf16", KernelTables())
    return cost.decode_step(d, 1, 4096)
