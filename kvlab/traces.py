"""Request traces in the Mooncake FAST'25 JSONL format: load, validate, find.

One JSON object per line, sorted by arrival:
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, ...]}
`timestamp` is in milliseconds; `hash_ids` holds one id per 512-token block of the prompt
(the last block may be partial), and an id stands for the block *and its whole prefix*.

Traces are data, not part of the package: they are looked up in `$KVLAB_TRACE_DIR`, then in
the download cache (`kvlab trace download`, see `kvlab.traces_download`), then in the shared
data folder beside the repository (`../shared/data/mooncake`). Where none is present the
book uses a generated stand-in (`kvlab.traces_gen`), always labelled as generated.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import KvlabError, unknown_name
from .prompt import served_from_blocks
from .trace_types import BLOCK_TOKENS, Request, Trace

TRACE_DIR_ENV = "KVLAB_TRACE_DIR"
GENERATED = "generated"  # `generated`, `generated:PRESET`, `generated:PRESET:SEED` name generated traces
POISSON = "poisson"  # `poisson:rate=R,prompt=P,output=O,...` names a plain generated workload
#: Public traces by short name -> file name in the Mooncake repository's
#: FAST25-release/traces/ folder.
KNOWN_TRACES = {
    "conversation": "conversation_trace.jsonl",
    "synthetic": "synthetic_trace.jsonl",
}


def _int_field(obj: dict, key: str, where: str, minimum: int) -> int:
    if key not in obj:
        raise KvlabError(f"{where}: missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise KvlabError(f"{where}: {key!r} must be a whole number, got {value!r}")
    if value < minimum:
        raise KvlabError(f"{where}: {key!r} must be >= {minimum}, got {value!r}")
    return int(value)


def parse_line(text: str, where: str, block_tokens: int = BLOCK_TOKENS) -> Request:
    """Parse and validate one JSONL line; `where` ('trace.jsonl line 17') prefixes errors."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvlabError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise KvlabError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    timestamp_ms = _int_field(obj, "timestamp", where, 0)
    input_tokens = _int_field(obj, "input_length", where, 1)
    output_tokens = _int_field(obj, "output_length", where, 1)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise KvlabError(f"{where}: 'hash_ids' must be a list of non-negative whole numbers")
    if len(set(ids)) != len(ids):
        raise KvlabError(f"{where}: 'hash_ids' repeats an id; each id names a different prefix of the prompt")
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
        handle = path.open("rb")
    except FileNotFoundError:
        raise KvlabError(f"trace file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise KvlabError(f"cannot read trace {str(path)!r}: {exc.strerror}") from None
    requests: list[Request] = []
    last_arrival = 0.0
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise KvlabError(f"{path.name} line {number}: not UTF-8 text") from None
            if not line.strip():
                continue
            req = parse_line(line, f"{path.name} line {number}")
            if req.arrival_s < last_arrival:
                raise KvlabError(
                    f"{path.name} line {number}: timestamp {req.arrival_s * 1000:.0f} ms goes back in "
                    f"time (previous {last_arrival * 1000:.0f} ms); traces must be sorted by arrival"
                )
            last_arrival = req.arrival_s
            requests.append(req)
    if not requests:
        raise KvlabError(f"trace {str(path)!r} holds no requests")
    return Trace(name or path.stem.removesuffix("_trace"), tuple(requests), source=str(path))


def cache_dir() -> Path:
    """Where `kvlab trace download` puts traces: $KVLAB_TRACE_DIR, else ~/.cache/kvlab/traces."""
    if os.environ.get(TRACE_DIR_ENV):
        return Path(os.environ[TRACE_DIR_ENV]).expanduser()
    return _default_cache_dir()


def _default_cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "kvlab" / "traces"


def trace_dirs() -> list[Path]:
    """Where named traces are looked up, in order: the user's folder, the download cache, shared data."""
    dirs = [cache_dir()]  # $KVLAB_TRACE_DIR when set
    if os.environ.get(TRACE_DIR_ENV):
        dirs.append(_default_cache_dir())  # traces downloaded before the variable was set
    repo = Path(__file__).resolve().parents[1]
    dirs.append(repo.parent / "shared" / "data" / "mooncake")
    return list(dict.fromkeys(dirs))


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
    """read_jsonl, remembered per (file, size, mtime): a book build asks for the same trace often."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, name)
    if key not in _LOADED:
        if len(_LOADED) >= 8:
            _LOADED.clear()
        _LOADED[key] = read_jsonl(path, name=name)
    return _LOADED[key]


@functools.lru_cache(maxsize=8)
def _generated(text: str) -> Trace:
    """`generated[:PRESET][:SEED]` -> a generated trace (kvlab.traces_gen), labelled as such."""
    from .traces_gen import PRESETS, generate_trace

    preset, seed = "conversation", 0
    for part in text.split(":")[1:]:
        if part.isdigit():
            seed = int(part)
        elif part in PRESETS:
            preset = part
        else:
            raise unknown_name("generated-trace preset", part, PRESETS, also="a seed (a whole number)")
    return generate_trace(preset, seed=seed)


@functools.lru_cache(maxsize=8)
def _poisson(text: str) -> Trace:
    """`poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S]` -> a plain generated workload."""
    from .traces_gen import poisson_trace

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
                f"trace {text!r} is not on this machine (looked in {looked}); run 'kvlab trace download "
                f"{text}', or set {TRACE_DIR_ENV} to the folder holding {KNOWN_TRACES[text]}"
            )
        return _read_cached(path, text)
    if text == GENERATED or text.startswith(GENERATED + ":"):
        return _generated(text)
    if text.startswith(POISSON + ":"):
        return _poisson(text)
    if text.endswith(".jsonl") or os.sep in text or Path(text).exists():
        path = Path(text)
        if not path.is_file():
            raise KvlabError(f"trace file {text!r} does not exist")
        return _read_cached(path, None)
    raise unknown_name("trace", text, KNOWN_TRACES, also="'generated[:PRESET][:SEED]', 'poisson:rate=R,prompt=P,output=O' or a "
                       "path to a .jsonl file")


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
    reusable_block_share: float  # block refs in a leading run already seen = infinite-cache block hit ratio
    reusable_token_share: float  # the same in prompt tokens (last block may be partial)
    block_tokens: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
        name=trace.name, label=trace.label, generated=trace.generated, requests=n,
        mean_input_tokens=float(inputs.mean()), median_input_tokens=float(np.median(inputs)),
        p99_input_tokens=float(np.percentile(inputs, 99)), max_input_tokens=int(inputs.max()),
        mean_output_tokens=float(trace.output_tokens.mean()), duration_s=duration,
        requests_per_s=n / duration if duration > 0 else math.inf,
        block_refs=refs, unique_blocks=len(seen), shared_prefix_requests=shared,
        shared_prefix_share=shared / n, reusable_block_share=reusable_blocks / refs,
        reusable_token_share=reusable_tokens / int(inputs.sum()), block_tokens=bt,
    )
