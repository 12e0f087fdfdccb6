"""Request traces in the Mooncake FAST'25 JSONL format: load, validate, find.

One JSON object per line, sorted by arrival:
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, ...]}
`timestamp` is in milliseconds; `hash_ids` holds one id per 512-token block of the prompt
(the last block may be partial), and an id stands for the block *and its whole prefix*.

Traces are data, not part of the package: they are looked up in `$KVLAB_TRACE_DIR`, then in
the download cache (`kvlab trace download`, see `kvlab.traces.download`), then in a shared
data folder `shared/data/mooncake` in the current folder or the nearest folder above it that
holds one (a workspace's checkouts share it: `../shared/data/mooncake` beside each). Where
none is present the book uses a generated stand-in (`kvlab.traces.generate`), always
labelled as generated. A trace file, once validated, is kept parsed on disk
(`kvlab.traces.cache`; KVLAB_TRACE_CACHE=0 turns that off).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import json.scanner
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import KvlabError, unknown_name
from ..prompt import served_from_blocks
from . import cache as parsed
from .generate import PRESETS, generate_trace, poisson_trace
from .types import BLOCK_TOKENS, Request, Trace

TRACE_DIR_ENV = "KVLAB_TRACE_DIR"
GENERATED = (
    "generated"  # `generated`, `generated:PRESET`, `generated:PRESET:SEED` name generated traces
)
POISSON = "poisson"  # `poisson:rate=R,prompt=P,output=O,...` names a plain generated workload
#: Public traces by short name -> file name in the Mooncake repository's
#: FAST25-release/traces/ folder.
KNOWN_TRACES = {
    "conversation": "conversation_trace.jsonl",
    "synthetic": "synthetic_trace.jsonl",
}


#: Bounds beyond which a field is a typo or an attack, not a request: a prompt or an answer
#: of more than 1e8 tokens, a timestamp past 1e15 ms (31,000 years), an id that is not a
#: 64-bit hash.
MAX_TOKENS = 100_000_000
MAX_TIMESTAMP_MS = 10**15
MAX_HASH_ID = 2**63 - 1


def _int_field(obj: dict, key: str, where: str, minimum: int, maximum: int) -> int:
    if key not in obj:
        raise KvlabError(f"{where}: missing {key!r}")
    value = obj[key]
    if type(value) is int:
        if minimum <= value <= maximum:
            return value
    elif type(value) is not float or not value.is_integer():  # bool, str, nan, inf, 6.5
        raise KvlabError(f"{where}: {key!r} must be a whole number, got {_show(value)}")
    elif minimum <= value <= maximum:
        return int(value)
    if value < minimum:
        raise KvlabError(f"{where}: {key!r} must be >= {minimum}, got {_show(value)}")
    raise KvlabError(f"{where}: {key!r} must be <= {maximum:.0e}, got {_show(value)}")


def _show(value) -> str:
    if type(value) is int and value.bit_length() > 100:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return _clip(repr(value))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hash_ids(obj: dict, where: str) -> list:
    ids = obj.get("hash_ids")
    if type(ids) is not list or (
        ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > MAX_HASH_ID)
    ):
        raise KvlabError(f"{where}: 'hash_ids' must be a list of whole numbers from 0 to 2**63 - 1")
    if len(set(ids)) != len(ids):
        raise KvlabError(
            f"{where}: 'hash_ids' repeats an id; each id names a different prefix of the prompt"
        )
    return ids


def _loads(text: str, where: str):
    """One JSON value; every way it can fail (bad syntax, nesting past the recursion limit,
    an integer of thousands of digits) is a KvlabError naming the line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvlabError(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise KvlabError(f"{where}: nested too deeply to be a request") from None
    except ValueError as exc:
        raise KvlabError(f"{where}: not valid JSON ({exc})") from None


def parse_line(text: str, where: str, block_tokens: int = BLOCK_TOKENS) -> Request:
    """Parse and validate one JSONL line; `where` ('trace.jsonl line 17') prefixes errors."""
    obj = _loads(text, where)
    if type(obj) is not dict:
        raise KvlabError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    timestamp_ms = _int_field(obj, "timestamp", where, 0, MAX_TIMESTAMP_MS)
    input_tokens = _int_field(obj, "input_length", where, 1, MAX_TOKENS)
    output_tokens = _int_field(obj, "output_length", where, 1, MAX_TOKENS)
    ids = _hash_ids(obj, where)
    blocks = -(-input_tokens // block_tokens)
    if len(ids) != blocks:
        raise KvlabError(
            f"{where}: {len(ids)} hash_ids for input_length {input_tokens}; expected "
            f"ceil({input_tokens}/{block_tokens}) = {blocks}"
        )
    return Request(timestamp_ms / 1000.0, input_tokens, output_tokens, tuple(ids))


def read_jsonl(path: str | Path, name: str | None = None) -> Trace:
    """Load a Mooncake-format JSONL file, validating every line (errors name the line)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise KvlabError(f"trace file {_show(str(path))} does not exist") from None
    except (OSError, ValueError) as exc:  # a folder, /proc/self/mem, a NUL byte in the name
        raise _unreadable(path, exc) from None
    requests = _parse_lines(data, path.name)
    if not requests:
        raise KvlabError(f"trace {_show(str(path))} holds no requests")
    return Trace(_trace_name(path, name), tuple(requests), source=str(path))


def _unreadable(path: Path, exc: Exception) -> KvlabError:
    reason = getattr(exc, "strerror", None) or exc
    return KvlabError(f"cannot read trace {_show(str(path))}: {reason}")


#: The C scanner that json.loads ends in, called directly (a third of the per-line cost saved).
_SCAN = json.scanner.make_scanner(json.JSONDecoder())


def _parse_lines(data: bytes, filename: str, block_tokens: int = BLOCK_TOKENS) -> list[Request]:
    """Every line, the common case checked inline; anything unusual goes through
    `parse_line`, which says exactly what is wrong and where."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = data.count(b"\n", 0, exc.start) + 1
        raise KvlabError(f"{filename} line {number}: not UTF-8 text") from None
    requests: list[Request] = []
    last_arrival = 0.0
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            obj, end = _SCAN(line, 0)
            ts, inp, out = obj["timestamp"], obj["input_length"], obj["output_length"]
            ids = obj["hash_ids"]
            ok = (
                end == len(line)
                and type(ts) is type(inp) is type(out) is int
                and type(ids) is list
                and 0 <= ts <= MAX_TIMESTAMP_MS
                and 0 < inp <= MAX_TOKENS
                and 0 < out <= MAX_TOKENS
                and len(ids) == -(-inp // block_tokens)
                and set(map(type, ids)) == {int}
                and 0 <= min(ids)
                and max(ids) <= MAX_HASH_ID
                and len(set(ids)) == len(ids)
            )
        except Exception:  # noqa: BLE001 - any surprise: the careful path below names it
            ok = False
        req = (
            Request(ts / 1000.0, inp, out, tuple(ids))
            if ok
            else parse_line(line, f"{filename} line {number}", block_tokens)
        )
        if req.arrival_s < last_arrival:
            raise KvlabError(
                f"{filename} line {number}: timestamp {req.arrival_s * 1000:.0f} ms "
                f"goes back in time (previous {last_arrival * 1000:.0f} ms); traces "
                "must be sorted by arrival"
            )
        last_arrival = req.arrival_s
        requests.append(req)
    return requests


#: A workspace's shared data folder, looked for from the current folder upwards.
SHARED_DATA = Path("shared") / "data" / "mooncake"


def cache_dir() -> Path:
    """Where `kvlab trace download` puts traces: $KVLAB_TRACE_DIR, else ~/.cache/kvlab/traces."""
    if os.environ.get(TRACE_DIR_ENV):
        return Path(os.environ[TRACE_DIR_ENV]).expanduser()
    return _default_cache_dir()


def _default_cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "kvlab" / "traces"


def trace_dirs() -> list[Path]:
    """Where named traces are looked up, in order: user's folder, download cache, shared data
    (the nearest `shared/data/mooncake` from the current folder up, where there is one)."""
    dirs = [cache_dir()]  # $KVLAB_TRACE_DIR when set
    if os.environ.get(TRACE_DIR_ENV):
        dirs.append(_default_cache_dir())  # traces downloaded before the variable was set
    here = Path.cwd()
    shared = [p / SHARED_DATA for p in (here, *here.parents) if (p / SHARED_DATA).is_dir()]
    return list(dict.fromkeys(dirs + shared[:1]))


def find_trace(name: str) -> Path | None:
    """The file of a known trace name, or None when it is not on this machine."""
    if name not in KNOWN_TRACES:
        raise unknown_name("trace", name, KNOWN_TRACES, also="a path to a .jsonl file")
    for folder in trace_dirs():
        candidate = folder / KNOWN_TRACES[name]
        if candidate.is_file():
            return candidate
    return None


_LOADED: dict[tuple, Trace] = {}


def _read_cached(path: Path, name: str | None) -> Trace:
    """read_jsonl, remembered per file version: a book build asks for the same trace often,
    and a pipe (`<(zcat trace.jsonl.gz)`) can be read only once."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise KvlabError(f"trace file {_show(str(path))} does not exist") from None
    except (OSError, ValueError) as exc:  # a name longer than the file system allows, a NUL byte
        raise _unreadable(path, exc) from None
    if stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, name)
    elif stat.S_ISFIFO(st.st_mode):
        key = (st.st_dev, st.st_ino, name)
    else:
        raise KvlabError(f"trace {_show(str(path))} is not a file")
    if key not in _LOADED:
        if len(_LOADED) >= 8:
            _LOADED.clear()
        _LOADED[key] = _read_file(path, name, st)
    return _LOADED[key]


def _read_file(path: Path, name: str | None, st: os.stat_result) -> Trace:
    """A regular file's requests come from the parsed-trace cache when this version of it
    was validated before (kvlab.traces.cache), else from read_jsonl, which fills the cache."""

    if not stat.S_ISREG(st.st_mode):
        return read_jsonl(path, name=name)
    requests = parsed.load(path, st, BLOCK_TOKENS)
    if requests:
        return Trace(_trace_name(path, name), requests, source=str(path))
    trace = read_jsonl(path, name=name)
    parsed.store(path, st, BLOCK_TOKENS, trace.requests)
    return trace


def _trace_name(path: Path, name: str | None) -> str:
    return name or path.stem.removesuffix("_trace")


def _is_path(text: str) -> bool:
    if text.endswith(".jsonl") or os.sep in text:
        return True
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # too long for the file system, a NUL byte
        return False


@functools.lru_cache(maxsize=8)
def _generated(text: str) -> Trace:
    """`generated[:PRESET][:SEED]` -> a generated trace (kvlab.traces.generate), labelled as
    such."""

    preset, seed = "conversation", 0
    for part in text.split(":")[1:]:
        if part.isdigit():
            seed = int(part)
        elif part in PRESETS:
            preset = part
        else:
            raise unknown_name(
                "generated-trace preset", part, PRESETS, also="a seed (a whole number)"
            )
    return generate_trace(preset, seed=seed)


@functools.lru_cache(maxsize=8)
def _poisson(text: str) -> Trace:
    """`poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S]` -> a plain generated workload."""

    return poisson_trace(text)


def load_trace(name_or_path: str | Path) -> Trace:
    """A trace by known name (`conversation`, `synthetic`), `generated[:PRESET][:SEED]`,
    `poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S]`, or a JSONL path."""
    if isinstance(name_or_path, Trace):
        return name_or_path
    text = str(name_or_path)
    if text in KNOWN_TRACES:
        path = find_trace(text)
        if path is None:
            looked = ", ".join(str(d) for d in trace_dirs())
            raise KvlabError(
                f"trace {text!r} is not on this machine (looked in {looked}); run 'kvlab trace "
                f"download {text}', or set {TRACE_DIR_ENV} to the folder holding "
                f"{KNOWN_TRACES[text]}"
            )
        return _read_cached(path, text)
    if text == GENERATED or text.startswith(GENERATED + ":"):
        return _generated(text)
    if text.startswith(POISSON + ":"):
        return _poisson(text)
    if _is_path(text):
        return _read_cached(Path(text), None)
    raise unknown_name(
        "trace",
        _clip(text),
        KNOWN_TRACES,
        also=(
            "'generated[:PRESET][:SEED]', 'poisson:rate=R,prompt=P,output=O' "
            "or a path to a .jsonl file"
        ),
    )


def trace_or_generated(name: str = "conversation", seed: int = 0) -> Trace:
    """The real trace when this machine has it, else a generated stand-in (its label says so).

    For a book built where no real trace exists: figures show `trace.label`, which ends in
    "(generated)" for the stand-in, so a reader never mistakes generated data for real.
    """
    if find_trace(name) is not None:
        return load_trace(name)
    preset = {"conversation": "conversation", "synthetic": "shared-prefix"}[name]
    return _generated(f"{GENERATED}:{preset}:{seed}")


# --------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class TraceStats:
    """What a trace holds. Sharing is defined on hash_ids (see `trace_stats`)."""

    name: str
    label: str
    generated: bool
    requests: int
    mean_input_tokens: float
    median_input_tokens: float
    p99_input_tokens: float
    max_input_tokens: int
    mean_output_tokens: float
    duration_s: float
    requests_per_s: float
    block_refs: int
    unique_blocks: int
    shared_prefix_requests: int  # requests whose first block appeared in an earlier request
    shared_prefix_share: float  # ... as a share of all requests
    reusable_block_share: (
        float  # block refs in a leading run already seen = infinite-cache block hit ratio
    )
    reusable_token_share: float  # the same in prompt tokens (last block may be partial)
    block_tokens: int

    def to_dict(self) -> dict:
        """JSON-ready: a rate that is infinite (every request at one instant) becomes null."""
        out = dataclasses.asdict(self)
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in out.items()
        }


def trace_stats(trace: Trace) -> TraceStats:
    """Counts, means and prefix sharing of a trace.

    A request *shares a prefix with an earlier one* when its first hash_id occurred in an
    earlier request: its first block (512 tokens, or the whole prompt if shorter) is identical
    to an earlier prompt's beginning. That is the most generous "request hit" a prefix cache
    can report. `reusable_*_share` is the opposite, strict view: the part of every prompt
    that an infinitely large block cache could skip (the leading run of already-seen blocks).
    """
    seen: set[int] = set()
    shared = refs = reusable_blocks = reusable_tokens = 0
    bt = trace.block_tokens
    for r in trace.requests:
        ids = r.hash_ids
        refs += len(ids)
        k = 0
        for h in ids:
            if h not in seen:
                break
            k += 1
        shared += k > 0
        reusable_blocks += k
        reusable_tokens += served_from_blocks(k, bt, r.input_tokens)
        seen.update(ids)
    n = len(trace)
    inputs = trace.input_tokens
    duration = trace.requests[-1].arrival_s - trace.requests[0].arrival_s
    return TraceStats(
        name=trace.name,
        label=trace.label,
        generated=trace.generated,
        requests=n,
        mean_input_tokens=float(inputs.mean()),
        median_input_tokens=float(np.median(inputs)),
        p99_input_tokens=float(np.percentile(inputs, 99)),
        max_input_tokens=int(inputs.max()),
        mean_output_tokens=float(trace.output_tokens.mean()),
        duration_s=duration,
        requests_per_s=n / duration if duration > 0 else math.inf,
        block_refs=refs,
        unique_blocks=len(seen),
        shared_prefix_requests=shared,
        shared_prefix_share=shared / n,
        reusable_block_share=reusable_blocks / refs,
        reusable_token_share=reusable_tokens / int(inputs.sum()),
        block_tokens=bt,
    )
