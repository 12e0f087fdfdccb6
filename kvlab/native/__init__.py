"""Native CPU decode kernels (kernels.c), compiled on first use and called through ctypes.

Why: the ledger says a decode step costs its bytes over the memory bandwidth. PyTorch's CPU
kernels do not stream those bytes at that speed (its bf16 batched matmul reads the KV cache
at 12-20 GB/s on a machine whose copy bandwidth is 40-75 GB/s), so on a CPU the measured
step would test PyTorch, not the physics. Two small kernels close the gap: a bf16
matrix-vector product for the weights and split-K decode attention for the history.

The library is built once per (source, compiler, CPU) with the system C compiler, cached
under `$KVLAB_NATIVE_DIR` (default `~/.cache/kvlab/native`), and written atomically. Where
it cannot be built (no compiler, a CPU without AVX512-BF16, not x86-64, `KVLAB_NATIVE=0`)
`status()` says why and the decoder keeps PyTorch's kernels: slower, same numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

try:
    import fcntl  # POSIX: the build and timing locks (`exclusive`)
except ImportError:  # elsewhere the work is only done twice
    fcntl = None

from ..errors import KvlabError

SOURCE = Path(__file__).with_name("kernels.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC")
REQUIRED_CPU_FLAGS = ("avx512f", "avx512_bf16")
#: Rows of x up to which the matrix-vector kernel beats oneDNN (decode batches); prefill
#: (hundreds of rows) is compute-bound and stays with PyTorch.
MAX_GEMV_ROWS = 16
#: Largest head_dim the attention kernel takes (kernels.c: MAX_HEAD_DIM).
MAX_HEAD_DIM = 512
#: The kernels' software-prefetch hints: "nta" non-temporal (fills L1 only; fastest on the AMD
#: EPYC reference machine), "l2" into L2 (on an Intel Xeon a non-temporal prefetch leaves the
#: L2 streamer idle: half the bandwidth). kernels.c: KVLAB_FLAG_PREFETCH_L2.
PREFETCH_HINTS = ("nta", "l2")
_FLAG_PREFETCH_L2, _FLAG_AMX = 1, 2
#: The variant each kernel runs now: its prefetch hint, and whether it may use AMX tiles
#: (batch 2-16 weights; the scores and p V), where the CPU and the OS allow them. Which
#: variant a machine gets, per kernel, is timed on first use (`kvlab.decoder.tune`); attention
#: over int8 KV has its own, as widening int8 is work the tiles may or may not pay for where
#: bf16 attention's choice goes the other way (timed, not assumed).
OPERATIONS = ("weights", "attention", "attention_int8")
_variant = {op: {"prefetch": "l2", "amx": True} for op in OPERATIONS}


def cache_dir() -> Path:
    """Where built libraries live: $KVLAB_NATIVE_DIR, else ~/.cache/kvlab/native."""
    env = os.environ.get("KVLAB_NATIVE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvlab" / "native"


@contextlib.contextmanager
def exclusive(path: Path):
    """Hold an exclusive lock on `.NAME.lock` beside `path` while the block runs: two kvlab
    processes that start at once (two benchmarks, the workers of a test run) build the
    library and time the kernels one after the other, and the second finds the first's
    result (re-check it inside the block) instead of building it again or timing kernels
    while the first times them, which would disturb both timings. Without a lock (a folder
    that cannot be written, no fcntl), the block runs unlocked: the work is only done twice."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(f".{path.name}.lock"), "a")  # kept: the lock's file
    except OSError:
        handle = None
    if handle is None or fcntl is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _cpu() -> tuple[str, set[str]]:
    """(model name, flags) from /proc/cpuinfo; ('', empty) where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", set()
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, flags


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache Linux reports (sysfs, cpu0), in bytes; None when it says nothing."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            pass
    return max(sizes) if sizes else None


def _compiler() -> tuple[str | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, ""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, ""
    return cc, (out.stdout.splitlines() or [""])[0].strip()


def build(directory: Path | None = None, cc: str | None = None) -> Path:
    """Compile kernels.c (if this source/compiler/CPU has not been built yet); the library's path.

    Raises KvlabError with the compiler's first error line when it fails."""
    cc_found, version = _compiler()
    cc = cc or cc_found
    if not cc:
        raise KvlabError(
            "no C compiler found (install gcc, or set CC); the decoder uses PyTorch's kernels"
        )
    cpu_name, flags = _cpu()
    source = SOURCE.read_bytes()
    parts = [
        source,
        " ".join(CFLAGS).encode(),
        cc.encode(),
        version.encode(),
        cpu_name.encode(),
        " ".join(sorted(flags)).encode(),
    ]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    directory = Path(directory) if directory else cache_dir()
    target = directory / f"kvlab-kernels-{key}.so"
    if target.exists():
        return target
    with exclusive(target):
        if not target.exists():  # another process may have built it while this one waited
            _compile(cc, directory, target)
    return target


def _compile(cc: str, directory: Path, target: Path) -> None:
    """kernels.c into `target`, atomically; KvlabError with the compiler's first error."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=directory)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *CFLAGS, str(SOURCE), "-o", tmp, "-lm"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            lines = proc.stderr.splitlines()
            errors = [ln for ln in lines if "error" in ln] or lines or ["?"]
            raise KvlabError(f"compiling {SOURCE.name} with {cc} failed: {errors[0].strip()}")
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkstemp's 0600 (the linker adds x): a 0755 library
        # atomic: a concurrent build or an interrupted one never leaves half a library
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@lru_cache(maxsize=None)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(library, what it is) or (None, why PyTorch's kernels are used instead)."""
    if os.environ.get("KVLAB_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by KVLAB_NATIVE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"native kernels are x86-64 only (this is {platform.machine()})"
    _, flags = _cpu()
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
    if missing:
        return None, f"this CPU lacks {', '.join(missing)}"
    # load torch's OpenMP runtime first, so the kernels share its threads
    import torch  # noqa: F401

    try:
        path = build()
        lib = ctypes.CDLL(str(path))
    except (KvlabError, OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.kvlab_native_isa.restype = ctypes.c_char_p
    lib.kvlab_amx_available.restype = ctypes.c_int
    lib.kvlab_gemv_bf16.argtypes = [p, p, p, i64, i64, i64, ctypes.c_int, ctypes.c_int]
    lib.kvlab_gemv_bf16.restype = ctypes.c_int
    lib.kvlab_decode_attention_bf16.argtypes = [
        p,
        p,
        p,
        p,
        p,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.kvlab_decode_attention_bf16.restype = ctypes.c_int
    lib.kvlab_decode_attention_int8.argtypes = [
        p,
        p,
        p,
        p,
        p,
        p,
        p,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.kvlab_decode_attention_int8.restype = ctypes.c_int
    return lib, f"native C kernels ({lib.kvlab_native_isa().decode()}, {_compiler()[1] or 'cc'})"


def available() -> bool:
    return _load()[0] is not None


def status() -> str:
    """One line: which decode kernels this machine gets, and why."""
    lib, what = _load()
    return what if lib is not None else f"PyTorch kernels ({what})"


def _lib() -> ctypes.CDLL:
    lib, why = _load()
    if lib is None:
        raise KvlabError(f"native kernels unavailable: {why}")
    return lib


def _threads() -> int:
    import torch

    return max(1, torch.get_num_threads())


def amx_available() -> bool:
    """Whether the kernels can use AMX tiles here (built for them, and Linux grants the state)."""
    lib, _ = _load()
    return lib is not None and bool(lib.kvlab_amx_available())


def variant() -> dict:
    """The variants in use: {"weights": {"prefetch", "amx"}, "attention": {...},
    "attention_int8": {...}}."""
    return {op: dict(v) for op, v in _variant.items()}


def set_variant(
    weights: dict | None = None, attention: dict | None = None, attention_int8: dict | None = None
) -> None:
    """Use these variants ({"prefetch": one of PREFETCH_HINTS, "amx": bool}) from now on in
    this process (the tuner's choice); None keeps an operation's current one."""
    given_by_op = {"weights": weights, "attention": attention, "attention_int8": attention_int8}
    for op, given in given_by_op.items():
        if given is None:
            continue
        if given.get("prefetch") not in PREFETCH_HINTS or not isinstance(given.get("amx"), bool):
            raise KvlabError(
                f"{op} variant must be {{'prefetch': one of {PREFETCH_HINTS}, 'amx': bool}}, "
                f"got {given!r}"
            )
        _variant[op] = {"prefetch": given["prefetch"], "amx": given["amx"]}


def _flags(op: str, prefetch: str | None, amx: bool | None) -> int:
    hint = _variant[op]["prefetch"] if prefetch is None else prefetch
    if hint not in PREFETCH_HINTS:
        raise KvlabError(f"prefetch hint must be one of {PREFETCH_HINTS}, got {hint!r}")
    use_amx = _variant[op]["amx"] if amx is None else amx
    return (_FLAG_PREFETCH_L2 if hint == "l2" else 0) | (_FLAG_AMX if use_amx else 0)


def gemv_supported(weight) -> bool:
    """Whether `pack_weight`/`gemv_bf16` take this weight: bf16 (N, K) on CPU, K even."""
    import torch

    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[1] % 2 == 0
        and available()
    )


def pack_weight(weight):
    """(N, K) bf16 -> the kernel's layout [ceil(N/32)][K/2][32][2]: per group of 32 output rows,
    each pair of k values of all 32 rows side by side (zero rows pad N to a multiple of 32)."""
    import torch

    N, K = weight.shape
    if weight.dtype != torch.bfloat16 or K % 2:
        raise KvlabError(
            f"pack_weight: need a bf16 (N, K) weight with K even, "
            f"got {tuple(weight.shape)} {weight.dtype}"
        )
    n32 = -(-N // 32) * 32
    padded = torch.cat([weight, weight.new_zeros(n32 - N, K)]) if n32 != N else weight
    # (N/32, K/2, 32, 2)
    return padded.reshape(n32 // 32, 32, K // 2, 2).permute(0, 2, 1, 3).contiguous()


def unpack_weight(packed, out_features: int):
    """Inverse of `pack_weight`: (N, K) bf16, for the prefill path's matmul."""
    groups, pairs, _, _ = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(groups * 32, pairs * 2)[:out_features]


def gemv_bf16(x, packed, out_features: int, prefetch: str | None = None, amx: bool | None = None):
    """x (..., K) @ W^T -> (..., N), W packed by `pack_weight`; bf16 in and out, fp32 accumulation.
    Meant for decode (a few rows); the work grows with rows x W, so prefill should unpack.
    `prefetch`, `amx`: the variant (default: `variant()["weights"]`)."""
    import torch

    if (
        packed.dim() != 4
        or packed.dtype != torch.bfloat16
        or packed.shape[2:] != (32, 2)
        or not 0 < out_features <= packed.shape[0] * 32
        or not packed.is_contiguous()
    ):
        raise KvlabError(
            "gemv_bf16: the weight must come from pack_weight, got "
            f"{tuple(packed.shape)} {packed.dtype}"
        )
    K = packed.shape[1] * 2
    if x.shape[-1] != K:
        raise KvlabError(f"gemv_bf16: x has {x.shape[-1]} features, the weight {K}")
    flat = x.reshape(-1, K).to(torch.bfloat16).contiguous()  # (M, K)
    y = torch.empty(flat.shape[0], out_features, dtype=torch.bfloat16)  # (M, N)
    flags = _flags("weights", prefetch, amx)
    _lib().kvlab_gemv_bf16(
        packed.data_ptr(),
        flat.data_ptr(),
        y.data_ptr(),
        flat.shape[0],
        out_features,
        K,
        _threads(),
        flags,
    )
    return y.view(*x.shape[:-1], out_features)


def attention_supported(k, k_scale, head_dim: int) -> bool:
    """Whether `decode_attention` takes this cache view: on CPU, head_dim % 64 == 0, and bf16
    K/V (no scales) or int8 K/V with fp16 scales."""
    import torch

    if k.device.type != "cpu" or head_dim % 64 or head_dim > MAX_HEAD_DIM or not available():
        return False
    if k_scale is None:
        return k.dtype == torch.bfloat16
    return k.dtype == torch.int8 and k_scale.dtype == torch.float16


def decode_attention(  # noqa: PLR0913 - mirrors the C kernel's arguments
    q,
    k,
    v,
    lengths,
    k_scale=None,
    v_scale=None,
    prefetch: str | None = None,
    amx: bool | None = None,
):
    """One query per sequence over the block-major cache; the contract of
    `kvlab.decoder.attention.decode_attention`, with lengths instead of a mask.

    q: (B, H, 1, D) scaled by 1/sqrt(D); k, v: (nb, B, KV, blk, D), bf16, or int8 with
    k_scale, v_scale (nb, B, KV, blk, 1) fp16 (contiguous views of the cache); lengths: (B,)
    int64, positions each sequence attends (the rest are stale); `prefetch`, `amx`: the variant
    (default: `variant()["attention"]`, over int8 KV `variant()["attention_int8"]`). Returns
    (B, H, 1, D) fp32."""
    import torch

    nb, B, KV, blk, D = k.shape
    H = q.shape[1]
    quant = k_scale is not None
    storage = torch.int8 if quant else torch.bfloat16
    if (
        q.shape != (B, H, 1, D)
        or v.shape != k.shape
        or H % KV
        or k.dtype != storage
        or v.dtype != storage
        or tuple(lengths.shape) != (B,)
        or D % 64
        or D > MAX_HEAD_DIM
    ):
        raise KvlabError(
            f"decode_attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)} "
            f"{k.dtype}, "
            f"v {tuple(v.shape)} {v.dtype}, lengths {tuple(lengths.shape)} do not fit "
            f"(bf16 K/V, or int8 with scales; head_dim % 64 == 0, <= {MAX_HEAD_DIM})"
        )
    tensors = [k, v]
    if quant:
        want = (nb, B, KV, blk, 1)
        scales = (k_scale, v_scale)
        if v_scale is None or any(t.shape != want or t.dtype != torch.float16 for t in scales):
            raise KvlabError(
                f"decode_attention: int8 K/V need fp16 k_scale and v_scale of shape {want}"
            )
        tensors += [k_scale, v_scale]
    if not all(t.is_contiguous() for t in tensors):
        raise KvlabError("decode_attention: K, V (and scales) must be contiguous block-major views")
    lens = lengths.to(torch.int64).contiguous()
    if int(lens.min()) < 1 or int(lens.max()) > nb * blk:
        raise KvlabError(f"decode_attention: lengths must be in 1..{nb * blk}, got {lens.tolist()}")
    qb = q.to(torch.bfloat16).contiguous()  # (B, H, 1, D) == (B, KV, G, D)
    out = torch.empty(B, H, 1, D, dtype=torch.float32)
    op = "attention_int8" if quant else "attention"
    dims = (nb, B, KV, H // KV, blk, D, _threads(), _flags(op, prefetch, amx))
    if quant:
        rc = _lib().kvlab_decode_attention_int8(
            qb.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            k_scale.data_ptr(),
            v_scale.data_ptr(),
            lens.data_ptr(),
            out.data_ptr(),
            *dims,
        )
    else:
        rc = _lib().kvlab_decode_attention_bf16(
            qb.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(), out.data_ptr(), *dims
        )
    if rc != 0:
        raise KvlabError("decode_attention: out of memory for the per-block partial sums")
    return out
