"""Request traces in the Mooncake FAST'25 JSONL format: load, validate, find.

One JSON object per line, sorted by arrival:
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, ...]}
`timestamp` is in milliseconds; `hash_ids` holds one id per 512-token block of the prompt
(the last block may be partial), and an id stands for the block *and its whole prefix*.

Traces are data, not part of the package: they are looked up in `$KVLAB_TRACE_DIR`, then
in the shared data folder beside the repository (`../shared/data/mooncake`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import KvlabError, unknown_name

BLOCK_TOKENS = 512  # tokens per hash_id block in the Mooncake traces
TRACE_DIR_ENV = "KVLAB_TRACE_DIR"
#: Public traces by short name -> file name in the Mooncake repository's
#: FAST25-release/traces/ folder.
KNOWN_TRACES = {
    "conversation": "conversation_trace.jsonl",
    "synthetic": "synthetic_trace.jsonl",
}


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]  # one per BLOCK_TOKENS-token block, each naming its whole prefix


@dataclass(frozen=True)
class Trace:
    """A validated trace. `generated` marks synthetic data made by kvlab, never real."""

    name: str
    requests: tuple[Request, ...]
    source: str  # file path, or a description of the generator and its seed
    generated: bool = False
    block_tokens: int = BLOCK_TOKENS

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def arrival_s(self) -> np.ndarray:
        return np.fromiter((r.arrival_s for r in self.requests), float, len(self.requests))

    @property
    def input_tokens(self) -> np.ndarray:
        return np.fromiter((r.input_tokens for r in self.requests), np.int64, len(self.requests))

    @property
    def output_tokens(self) -> np.ndarray:
        return np.fromiter((r.output_tokens for r in self.requests), np.int64, len(self.requests))

    @property
    def label(self) -> str:
        """How figures should name it: generated traces say so."""
        return f"{self.name} (generated)" if self.generated else self.name


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
        handle = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise KvlabError(f"trace file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise KvlabError(f"cannot read trace {str(path)!r}: {exc.strerror}") from None
    requests: list[Request] = []
    last_arrival = 0.0
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
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
        except UnicodeDecodeError:
            raise KvlabError(f"{path.name} line {number + 1}: not UTF-8 text") from None
    if not requests:
        raise KvlabError(f"trace {str(path)!r} holds no requests")
    return Trace(name or path.stem.removesuffix("_trace"), tuple(requests), source=str(path))


def trace_dirs() -> list[Path]:
    """Where named traces are looked up, in order."""
    dirs = []
    if os.environ.get(TRACE_DIR_ENV):
        dirs.append(Path(os.environ[TRACE_DIR_ENV]).expanduser())
    repo = Path(__file__).resolve().parents[1]
    dirs.append(repo.parent / "shared" / "data" / "mooncake")
    return dirs


def find_trace(name: str) -> Path | None:
    """The file of a known trace name, or None when it is not on this machine."""
    if name not in KNOWN_TRACES:
        raise unknown_name("trace", name, KNOWN_TRACES, also="a path to a .jsonl file")
    for folder in trace_dirs():
        candidate = folder / KNOWN_TRACES[name]
        if candidate.is_file():
            return candidate
    return None


def load_trace(name_or_path: str | Path) -> Trace:
    """A trace by known name (`conversation`, `synthetic`) or by path to a JSONL file."""
    text = str(name_or_path)
    if text in KNOWN_TRACES:
        path = find_trace(text)
        if path is None:
            looked = ", ".join(str(d) for d in trace_dirs())
            raise KvlabError(
                f"trace {text!r} is not on this machine (looked in {looked}); set "
                f"{TRACE_DIR_ENV} to the folder holding {KNOWN_TRACES[text]}"
            )
        return read_jsonl(path, name=text)
    if text.endswith(".jsonl") or os.sep in text or Path(text).exists():
        return read_jsonl(text)
    raise unknown_name("trace", text, KNOWN_TRACES, also="a path to a .jsonl file")
