"""The resume file: what an interrupted search keeps, one JSON line per finished design.

    line 1    {"kvlab_plan_resume": 1, "job": {...}}   what the results depend on
    line 2..  {"key": "<design key>", "result": {...}}  one per evaluated design

Each result is appended and flushed as it finishes; a rerun with the same file skips the
designs it holds. The file is checked before anything runs: a header for another job
(other model, workload, SLOs, dtypes, tolerance or seed) or a malformed line is refused
with one line. A last line cut short without its newline (the process was killed while
writing it) is dropped, and its design runs again.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import KvlabError
from ..jsonsafe import jsonable

FORMAT = 1
HEADER = "kvlab_plan_resume"
#: Fields every stored result must have, with their types.
RESULT_FIELDS = {
    "saturation_requests_per_s": (int, float),
    "saturation_spread_requests_per_s": (int, float),
    "saturation_by_slice": list,
    "probes": list,
    "simulations": int,
}


def normalized(result: dict) -> dict:
    """A result as it reads back from the file (JSON types, None for inf/NaN), so that a
    resumed search and a fresh one hold equal tables."""
    return json.loads(json.dumps(jsonable(result), allow_nan=False))


def _fail(path, lineno: int, why: str) -> KvlabError:
    return KvlabError(f"--resume {path}: line {lineno}: {why}")


def _check_result(path, lineno: int, entry) -> tuple[str, dict]:
    if not isinstance(entry, dict) or set(entry) != {"key", "result"}:
        raise _fail(path, lineno, "expected an object with 'key' and 'result'")
    key, result = entry["key"], entry["result"]
    if not isinstance(key, str) or not isinstance(result, dict):
        raise _fail(path, lineno, "'key' must be a string and 'result' an object")
    for name, kinds in RESULT_FIELDS.items():
        value = result.get(name)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise _fail(path, lineno, f"result of {key!r} lacks a valid {name!r}")
    rate = result["saturation_requests_per_s"]
    if not math.isfinite(rate) or rate < 0:
        raise _fail(path, lineno, f"result of {key!r} has saturation {rate!r}")
    return key, result


def load(path, job: dict) -> dict[str, dict]:
    """The results stored in `path` for `job` ({} when the file is absent or empty); raises
    KvlabError on a file written for another job or a malformed line."""
    path = Path(path)
    if path.is_dir():
        raise KvlabError(f"--resume {path} is a folder; name a file")
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"--resume {path}: cannot read it: {exc}") from None
    if not text:
        return {}
    lines = text.split("\n")
    cut_short = lines[-1] != ""
    if not cut_short:
        lines.pop()
    out: dict[str, dict] = {}
    for i, line in enumerate(lines, start=1):
        last = i == len(lines)
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if last and cut_short and i > 1:
                _truncate(path, len(text) - len(line))
                break
            raise _fail(path, i, "not a JSON object (is this a kvlab plan resume file?)") from None
        if i == 1:
            if not isinstance(entry, dict) or entry.get(HEADER) != FORMAT:
                raise _fail(path, 1, "not a kvlab plan resume file (no header)")
            if entry.get("job") != job:
                raise KvlabError(
                    f"--resume {path} holds another search's results: "
                    f"{_diff(entry.get('job'), job)}; use another file"
                )
            continue
        key, result = _check_result(path, i, entry)
        out[key] = result
    return out


def _diff(theirs, ours: dict) -> str:
    if not isinstance(theirs, dict):
        return "its header has no job"
    keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    return "its " + ", ".join(keys) + " differ" if keys else "its job differs"


def _truncate(path: Path, size: int) -> None:
    """Drop a last line cut short by a kill, so appends start on a fresh line."""
    with open(path, "rb+") as f:
        f.truncate(size)


class Writer:
    """Appends results to the resume file, one flushed line each."""

    def __init__(self, path, job: dict):
        self.path = Path(path)
        try:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise KvlabError(f"--resume {path}: cannot write it: {exc.strerror or exc}") from None
        if new:
            self._write({HEADER: FORMAT, "job": job})

    def _write(self, obj) -> None:
        self._file.write(json.dumps(obj, sort_keys=True, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def append(self, key: str, result: dict) -> None:
        self._write({"key": key, "result": result})

    def close(self) -> None:
        self._file.close()
