"""Which CPU decode kernels this machine streams fastest: timed once, remembered per machine.

`--kernels auto` must not guess. kvlab's native kernels beat PyTorch's by 2-4x on one machine
and lost to them by 2x on the next (a non-temporal prefetch that an AMD EPYC liked starved an
Intel Xeon's L2 streamer), so the choice is measured: on first use on a machine, each candidate
(every native variant: prefetch hint x AMX tiles where there are any; and PyTorch's kernels, as
the decoder runs them) does the two things a decode step does, stream weights (a matrix-vector
product at batch 1 and 8) and stream KV (decode attention over bf16 KV at batch 1 and 8), over
a working set twice the last-level cache (256 to 512 MiB), the candidates interleaved so that a
disturbance hits them alike. kvlab's kernels take the fastest variant for each of the two
(batch-8 weights may want tiles where attention does not), and they win if those two together
beat PyTorch's. Attention over int8 KV is timed too, for kvlab's variants only, and gets its
own fastest variant (widening int8 is work that AMX tiles may take off the vector units, which
bf16 attention does not have). The result, with every timing, is written under the native cache
directory, keyed by the CPU's model and flags, the kernel source, torch's version and the
thread count, and read back on every later run (a few seconds the first time, nothing after).
`refresh=True` (or deleting the file) measures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from .. import native
from ..errors import KvlabError

#: Working set of the timing (weights + KV): twice the last-level cache, within these bounds.
MIN_WORKING_SET_BYTES = 256 << 20
MAX_WORKING_SET_BYTES = 512 << 20
#: Timed rounds (each runs every candidate once, interleaved) after one untimed round.
ROUNDS = 4
#: The shapes: a Llama-like hidden size and KV layout (cpu-bench's: 4 KV heads of 128, 4
#: query heads per KV head, 1024-token blocks); two batches, as the benchmark sweeps.
HIDDEN = 2048
KV_HEADS, GROUP, HEAD_DIM, BLOCK = 4, 4, 128, 1024
BATCHES = (1, 8)
VERSION = 3


def last_level_cache_bytes() -> int:
    """The largest CPU cache Linux reports, 32 MiB where it says nothing."""
    return native.last_level_cache_bytes() or 32 << 20


def working_set_bytes() -> int:
    llc = last_level_cache_bytes()
    return int(min(MAX_WORKING_SET_BYTES, max(MIN_WORKING_SET_BYTES, 2 * llc)))


def candidates() -> list[dict]:
    """Every kernel set to time here: native variants (where native builds) and torch."""
    out = []
    if native.available():
        amx = (False, True) if native.amx_available() else (False,)
        for prefetch in native.PREFETCH_HINTS:
            for use_amx in amx:
                name = f"native-{prefetch}" + ("-amx" if use_amx else "")
                out.append(
                    {"name": name, "kernels": "native", "prefetch": prefetch, "amx": use_amx}
                )
    out.append({"name": "torch", "kernels": "torch"})
    return out


def cache_key() -> str:
    cpu, flags = native._cpu()
    parts = [
        f"v{VERSION}",
        cpu,
        " ".join(sorted(flags)),
        hashlib.sha256(native.SOURCE.read_bytes()).hexdigest(),
        torch.__version__,
        str(torch.get_num_threads()),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def cache_path() -> Path:
    return native.cache_dir() / f"kernel-choice-{cache_key()}.json"


def choice(refresh: bool = False) -> dict:
    """This machine's timed choice: {"kernels": "native" | "torch", "native": {"weights",
    "attention": the fastest variant of each, "total_s"} (None without native kernels),
    "torch_total_s", "timings_s" (per candidate: per workload and totals),
    "working_set_bytes", "path", "cached"}. Measured on first use (or `refresh`), read back
    from the cache after."""
    path = cache_path()
    found = None if refresh else _cached(path)
    if found:
        return found
    with native.exclusive(path):  # one process times the kernels; the others wait, then read
        found = None if refresh else _cached(path)
        if found:
            return found
        result = measure()
        result["key"] = cache_key()
        _write(path, result)
    return {**result, "path": str(path), "cached": False}


def _cached(path: Path) -> dict | None:
    """The choice stored at `path` for this machine's key, else None."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {**found, "path": str(path), "cached": True} if found.get("key") == cache_key() else None


def _write(path: Path, result: dict) -> None:
    """Atomically; a cache that cannot be written only means timing again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".choice-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def _tiled(shape: tuple, dtype, g) -> torch.Tensor:
    """Random KV (one random block of every sequence and head, tiled over the blocks): an
    attention kernel's speed depends on its values, as an online softmax rescales its sums
    whenever a new score beats the running maximum, which a constant fill never does; tiling
    fills gigabytes in a blink. int8: values in -127..127; fp16 (scales): 0.005-0.02."""
    one = (1, *shape[1:])
    if dtype == torch.int8:
        block = torch.randint(-127, 128, one, generator=g, dtype=torch.int8)
    elif dtype == torch.float16:
        block = (0.005 + 0.015 * torch.rand(one, generator=g)).to(dtype)
    else:
        block = torch.randn(one, generator=g).to(dtype)
    return block.expand(shape).contiguous()


def measure(rounds: int = ROUNDS) -> dict:
    """Time every candidate (see the module docstring); the choice and all timings."""
    from .attention import decode_attention  # noqa: PLC0415 - torch loads only when used
    from .linear import _onednn_linear, onednn_layout  # noqa: PLC0415 - torch loads only when used

    cands = candidates()
    total = working_set_bytes()
    weight_bytes = total * 2 // 3
    out_features = max(32, weight_bytes // (2 * HIDDEN) // 32 * 32)
    # a weight's value does not change a product's speed; a constant fills gigabytes in a blink
    plain = torch.full((out_features, HIDDEN), 0.01, dtype=torch.bfloat16)
    onednn = onednn_layout(plain)
    if onednn is not None:
        plain = None  # torch's kernels stream the prepacked copy, as the decoder's do
    packed = (
        torch.full((out_features // 32, HIDDEN // 2, 32, 2), 0.01, dtype=torch.bfloat16)
        if native.available()
        else None
    )
    kv_token_bytes = 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    kv, kv_int8 = {}, {}
    g = torch.Generator().manual_seed(0)
    for batch in BATCHES:
        blocks = max(1, (total - weight_bytes) // (kv_token_bytes * BLOCK * batch))
        shape = (blocks, batch, KV_HEADS, BLOCK, HEAD_DIM)
        k, v = _tiled(shape, torch.bfloat16, g), _tiled(shape, torch.bfloat16, g)
        q = torch.randn(batch, KV_HEADS * GROUP, 1, HEAD_DIM, generator=g) / HEAD_DIM**0.5
        q = q.to(torch.bfloat16)
        lengths = torch.full((batch,), blocks * BLOCK, dtype=torch.int64)
        kv[batch] = (q, k, v, lengths)
        if packed is not None:  # the same positions as int8 with fp16 scales (half the bytes)
            scales = [_tiled((*shape[:-1], 1), torch.float16, g) for _ in range(2)]
            k8, v8 = _tiled(shape, torch.int8, g), _tiled(shape, torch.int8, g)
            kv_int8[batch] = (q, k8, v8, lengths, *scales)
    xs = {b: torch.full((b, HIDDEN), 0.01, dtype=torch.bfloat16) for b in BATCHES}

    def workloads(c: dict) -> dict:
        """{workload: call} for one candidate: weights and KV at each batch."""
        work = {}
        for b in BATCHES:
            q, k, v, lengths = kv[b]
            if c["kernels"] == "native":
                variant = {"prefetch": c["prefetch"], "amx": c["amx"]}
                weights = partial(native.gemv_bf16, xs[b], packed, out_features, **variant)
                attend = partial(native.decode_attention, q, k, v, lengths, **variant)
                work[f"kv-int8 b={b}"] = partial(native.decode_attention, *kv_int8[b], **variant)
            else:
                if onednn is not None:
                    weights = partial(_onednn_linear, xs[b], onednn)
                else:
                    weights = partial(torch.nn.functional.linear, xs[b], plain)
                attend = partial(decode_attention, q, k, v, None, None, None, 1 << 26)
            work[f"weights b={b}"], work[f"kv b={b}"] = weights, attend
        return work

    runs = {c["name"]: workloads(c) for c in cands}
    times: dict[str, dict[str, list[float]]] = {n: {w: [] for w in runs[n]} for n in runs}
    with torch.no_grad():
        for r in range(rounds + 1):
            for name, work in runs.items():
                for w, fn in work.items():
                    t0 = time.perf_counter()
                    fn()
                    if r:  # round 0 warms up
                        times[name][w].append(time.perf_counter() - t0)
    timings = {}
    for name, per in times.items():
        med = {w: statistics.median(ts) for w, ts in per.items()}
        weights_s = sum(t for w, t in med.items() if w.startswith("weights"))
        attention_s = sum(t for w, t in med.items() if w.startswith("kv b="))
        int8 = [t for w, t in med.items() if w.startswith("kv-int8")]
        timings[name] = {
            "total_s": weights_s + attention_s,
            "weights_s": weights_s,
            "attention_s": attention_s,
            **({"attention_int8_s": sum(int8)} if int8 else {}),
            **{w + " s": t for w, t in med.items()},
        }
    return {
        **pick(timings, {c["name"]: c for c in cands}),
        "timings_s": timings,
        "working_set_bytes": total,
        "weight_bytes": out_features * HIDDEN * 2,
        "threads": torch.get_num_threads(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def pick(timings: dict, by_name: dict) -> dict:
    """The choice from the timings: kvlab's kernels take, per operation (weights, attention,
    attention over int8 KV where timed, else the bf16 attention's), their fastest variant;
    they win if weights and bf16 attention together beat PyTorch's two."""
    natives = [n for n in timings if by_name[n]["kernels"] == "native"]
    best = {}
    ops = (("weights", "weights_s"), ("attention", "attention_s"))
    if natives and all("attention_int8_s" in timings[n] for n in natives):
        ops += (("attention_int8", "attention_int8_s"),)
    for op, key in ops:
        if natives:
            name = min(natives, key=lambda n: timings[n][key])
            best[op] = {"name": name, **{k: by_name[name][k] for k in ("prefetch", "amx")}}
    if natives and "attention_int8" not in best:
        best["attention_int8"] = best["attention"]
    native_s = (
        timings[best["weights"]["name"]]["weights_s"]
        + timings[best["attention"]["name"]]["attention_s"]
        if natives
        else None
    )
    torch_s = timings["torch"]["total_s"] if "torch" in timings else None
    faster = native_s is not None and (torch_s is None or native_s < torch_s)
    return {
        "kernels": "native" if faster else "torch",
        "native": {**best, "total_s": native_s} if natives else None,
        "torch_total_s": torch_s,
    }


def note(c: dict) -> str:
    """One line: what was timed and what won, e.g. for a benchmark's environment."""
    when = "timed on this machine" + (" earlier" if c.get("cached") else "")
    parts = []
    if c.get("native"):
        n = c["native"]
        int8 = n.get("attention_int8", n["attention"])["name"]
        parts.append(
            f"kvlab's {n['total_s'] * 1e3:.1f} ms (weights {n['weights']['name']}, "
            f"attention {n['attention']['name']}, over int8 KV {int8})"
        )
    if c.get("torch_total_s") is not None:
        parts.append(f"PyTorch's {c['torch_total_s'] * 1e3:.1f} ms")
    mib = c["working_set_bytes"] / 2**20
    return f"{when}: {' vs '.join(parts)} over a {mib:.0f} MiB working set"


def require_native(c: dict) -> dict:
    if not c.get("native"):
        raise KvlabError(f"native kernels unavailable: {native.status()}")
    return c["native"]
