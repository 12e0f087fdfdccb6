"""Teaching labs: exercises whose answers kvlab checks, and student copies of the notebooks.

In a chapter notebook an exercise is one code cell:

    answer = 2e12 / cost.weight_bytes("article-7b")  # ANSWER
    labs.check("ch1.ceiling", answer)

The repository keeps the reference answer (a worked computation, nbval-tested); `make
labs` writes student copies in which every `# ANSWER` line becomes `answer = ...`. A
check within tolerance passes; a wrong or missing answer gets a hint naming the quantity
to recheck. The expected values come from kvlab, never from a typed number.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import KvlabError, unknown_name

ANSWER_MARK = "# ANSWER"
BLANK = "answer = ...  # your answer here"


@dataclass(frozen=True)
class Exercise:
    key: str
    unit: str
    expected: Callable[[], float]  # computed by kvlab
    hint: str  # the quantity to recheck
    rel_tol: float = 0.02


@dataclass(frozen=True)
class CheckResult:
    key: str
    passed: bool
    message: str

    def _repr_html_(self) -> str:
        colour = "#009E73" if self.passed else "#D55E00"
        mark = "✔" if self.passed else "✘"
        return f'<p class="kvlab-check" style="color:{colour}"><b>{mark}</b> {self.message}</p>'

    def __repr__(self) -> str:
        return ("PASS " if self.passed else "FAIL ") + self.message


_EXERCISES: dict[str, Exercise] = {}


def exercise(key: str, unit: str, hint: str, rel_tol: float = 0.02):
    """Register the decorated function as the kvlab computation of exercise `key`'s answer."""
    def register(expected: Callable[[], float]) -> Callable[[], float]:
        _EXERCISES[key] = Exercise(key, unit, expected, hint, rel_tol)
        return expected

    return register


@exercise("ch1.ceiling", "tokens/s",
          "the weight bytes (parameters x 2 bytes in fp16) and the bandwidth in bytes per second")
def _ceiling():
    from . import cost
    from .article import ARTICLE_BANDWIDTH_BYTES_PER_S

    return ARTICLE_BANDWIDTH_BYTES_PER_S / cost.weight_bytes("article-7b", "fp16")


@exercise("ch1.ttft_ratio", "x",
          "the prefill FLOPs of the uncached tokens, including causal attention over the cached prefix")
def _ttft_ratio():
    from . import cost
    from .prompt import served_tokens

    miss = cost.prefill("llama-3.1-8b", "h100-sxm", 8192)
    hit = cost.prefill("llama-3.1-8b", "h100-sxm", 8192, cached_tokens=served_tokens(int(0.9 * 8192), 8192))
    return miss.ttft_s / hit.ttft_s


@exercise("ch1.tpot_ms", "ms",
          "the bytes one decode step moves (weights + KV history); the hit rate does not enter TPOT")
def _tpot_ms():
    from . import cost

    return 1e3 * cost.decode_step("llama-3.1-8b", "h100-sxm", 1, 8192).step_time_s


@exercise("ch2.kv_per_token", "bytes",
          "the KV heads: Llama 2 7B uses full multi-head attention (32 KV heads), 2 bytes per element")
def _kv_token():
    from . import cost

    return cost.kv_bytes_per_token("llama-2-7b", "fp16")


@exercise("ch2.kv_equals_weights_batch", "sequences",
          "the weight bytes streamed per step and the KV bytes per token (Qwen2.5 7B has 4 KV heads)")
def _kv_equals_weights():
    from . import cost

    s = cost.decode_step("qwen2.5-7b", "h100-sxm", 1, 8192)
    return s.weight_read_bytes / (8192 * s.kv_bytes_per_token)


@exercise("ch2.int4_speedup", "x", "which term dominates the bytes at 16K x 8: int4 shrinks only the weights")
def _int4_speedup():
    from . import cost

    fp16 = cost.decode_step("article-7b", "h100-sxm", 8, 16384)
    int4 = cost.decode_step("article-7b", "h100-sxm", 8, 16384, weight_dtype="int4")
    return int4.tokens_per_s / fp16.tokens_per_s


@exercise("ch3.request_kv_mib", "MiB",
          "the KV bytes per token (2 x layers x KV heads x head_dim x 2 bytes) and MiB = 2**20 bytes")
def _request_kv_mib():
    from . import cost

    return 4096 * cost.kv_bytes_per_token("article-7b", "fp16") / 2**20


@exercise("ch3.transfer_10gbe_s", "s", "the link's bytes per second: 10 Gb/s is 1.25e9 bytes/s, not 10e9")
def _transfer_10gbe_s():
    from .tiers import kv_fetch_time_s

    return kv_fetch_time_s("article-7b", 4096, "ethernet-10g", latency_s=0.0)


@exercise("ch3.host_slowdown", "x",
          "the KV bytes read per step and the PCIe 5.0 x16 bandwidth (63 GB/s) against HBM's")
def _host_slowdown():
    from .tiers import tiered_decode_step

    return tiered_decode_step("article-7b", "h100-sxm", 8, 4096, "host-pcie5").slowdown


@exercise("ch4.transfer_over_prefill", "",
          "the KV bytes of 8,192 tokens over 25 GB/s (a 200 Gb/s NIC) against the prefill's FLOPs")
def _transfer_over_prefill():
    from . import cost
    from .tiers import kv_fetch_time_s

    return kv_fetch_time_s("llama-3.1-8b", 8192, "ib-200g") / cost.prefill("llama-3.1-8b", "h100-sxm", 8192).time_s


@exercise("ch4.remote_every_step", "x",
          "the whole KV history read over the NIC at every step, on top of the weights read from HBM")
def _remote_every_step():
    from .tiers import tiered_decode_step

    return tiered_decode_step("llama-3.1-8b", "h100-sxm", 1, 8192, "remote-ib-200g").slowdown


@exercise("ch5.knee_16k", "sequences",
          "the batch at which the KV reads of a step reach the weight bytes (kvlab.cost.batch_knee)")
def _knee_16k():
    import numpy as np

    from . import cost
    from .grids import BATCH_GRID

    grid = np.array(BATCH_GRID)
    return float(grid[cost.batch_knee(cost.decode_step("llama-3.1-8b", "h100-sxm", grid, 16384))])


@exercise("ch5.fraction_of_ceiling", "",
          "the ceiling: batch x bandwidth / bytes per step, with the KV of all 8 sequences counted")
def _fraction_of_ceiling():
    from . import cost

    return 600 / cost.decode_step("llama-3.1-8b", "h100-sxm", 8, 16384).tokens_per_s


@exercise("ch5b.unlimited_token_hit_ratio", "",
          "the replay's token hit ratio (prompt tokens served / all prompt tokens), not its request-level "
          "hit rate; a hit never serves a prompt's last token")
def _unlimited_token_hit_ratio():
    import math

    from .prefix import replay
    from .traces import trace_or_generated

    return replay(trace_or_generated("conversation"), math.inf).token_hit_ratio


@exercise("ch5b.request_over_token", "x",
          "the two definitions of a hit in the same replay: requests that found any cached block, against "
          "prompt tokens served")
def _request_over_token():
    import math

    from .prefix import replay
    from .traces import trace_or_generated

    r = replay(trace_or_generated("conversation"), math.inf)
    return r.request_hit_rate / r.token_hit_ratio


def _exercises() -> dict[str, Exercise]:
    return dict(_EXERCISES)


def exercises() -> dict[str, Exercise]:
    return _exercises()


def check(key: str, answer) -> CheckResult:
    """Check an answer; returns a result that notebooks display (never raises on a wrong one)."""
    ex = _exercises().get(key)
    if ex is None:
        raise unknown_name("exercise", key, _exercises())
    if answer is Ellipsis or answer is None:
        return CheckResult(key, False, f"{key}: not answered yet. Replace `...` with your answer{' in ' + ex.unit if ex.unit else ''}. "
                                       f"Hint: work from {ex.hint}.")
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return CheckResult(key, False, f"{key}: expected a number in {ex.unit}, got {answer!r}.")
    expected = ex.expected()
    if math.isfinite(value) and math.isclose(value, expected, rel_tol=ex.rel_tol):
        return CheckResult(key, True, f"{key}: correct ({value:,.4g}{_unit(ex)}).")
    off = (value - expected) / expected if math.isfinite(value) else math.inf
    direction = "high" if off > 0 else "low"
    return CheckResult(key, False, f"{key}: {value:,.4g}{_unit(ex)} is {abs(off):.0%} too {direction}. "
                                   f"Recheck {ex.hint}.")


def _unit(ex: Exercise) -> str:
    return f" {ex.unit}" if ex.unit else ""


# ------------------------------------------------------------------ student copies
_ANSWER_START = re.compile(r"^(?P<indent>\s*)answer\s*=")


def blank_answers(source: str) -> str:
    """Replace every `answer = ...` statement that ends with `# ANSWER` (it may span lines)
    with a blank for the student."""
    out, block = [], None
    for line in source.splitlines(keepends=True):
        start = _ANSWER_START.match(line)
        if block is None and start:
            block = (start["indent"], [])
        if block is None:
            out.append(line)
            continue
        block[1].append(line)
        if ANSWER_MARK in line:
            out.append(block[0] + BLANK + ("\n" if line.endswith("\n") else ""))
            block = None
    if block is not None:  # an `answer =` without the mark: leave it as written
        out.extend(block[1])
    return "".join(out)


def write_student_copies(notebooks: list[Path], out_dir: Path) -> list[Path]:
    """Write copies of the notebooks with answers blanked and outputs cleared."""
    import nbformat

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        blanked = 0
        for cell in nb.cells:
            if cell.cell_type == "code":
                new = blank_answers(cell.source)
                blanked += new != cell.source
                cell.source = new
                cell.outputs, cell.execution_count = [], None
        if not blanked:
            continue
        target = out_dir / path.name
        tmp = target.with_suffix(".partial.ipynb")
        nbformat.write(nb, tmp)
        tmp.replace(target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m kvlab.labs [NOTEBOOK_DIR] [OUT_DIR]`: write the student copies."""
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else Path("notebooks")
    out = Path(argv[1]) if len(argv) > 1 else Path("labs")
    if not src.is_dir():
        raise SystemExit(f"kvlab labs: error: {src} is not a folder of notebooks")
    written = write_student_copies(sorted(src.glob("[0-9]*.ipynb")), out)
    for path in written:
        print(f"wrote {path}")
    if not written:
        raise SystemExit("kvlab labs: error: no notebook holds an exercise (`# ANSWER` lines)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KvlabError as exc:
        sys.exit(f"kvlab labs: error: {exc}")
