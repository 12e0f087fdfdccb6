"""Teaching labs: exercises whose answers kvlab checks, and student copies of the notebooks.

In a chapter notebook an exercise is one code cell:

    answer = 2e12 / cost.weight_bytes("article-7b")  # ANSWER
    labs.check("ch1.ceiling", answer)

The repository keeps the reference answer (a worked computation, nbval-tested); `make
labs` writes student copies in which every `# ANSWER` line becomes `answer = ...`. A
check within tolerance passes; a wrong or missing answer gets a hint naming the quantity
to recheck. The expected values come from kvlab, never from a typed number.

The verdicts speak the reader's language: in the Chinese edition (KVLAB_BOOK_LANG=zh_CN,
kvlab.viz.i18n) they are written in Chinese, with the exercise's `hint_zh` (its English
hint where an exercise has none yet).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import cost
from .article import ARTICLE_BANDWIDTH_BYTES_PER_S
from .cli import Parser, guarded
from .deployment import Deployment, KernelTables
from .errors import KvlabError, unknown_name
from .grids import BATCH_GRID
from .hardware import get_device
from .kernel_tables import load
from .models import get_model
from .parallel import allreduce_link
from .prefix import replay
from .prompt import served_tokens
from .speculative import breakeven_batch, tokens_per_verify_step
from .tiers import TierPath, kv_fetch_time_s, tiered_decode_step
from .traces import trace_or_generated
from .viz.i18n import chinese

ANSWER_MARK = "# ANSWER"
BLANK = "answer = ...  # your answer here"


@dataclass(frozen=True)
class Exercise:
    key: str
    unit: str
    expected: Callable[[], float]  # computed by kvlab
    hint: str  # the quantity to recheck
    rel_tol: float = 0.02
    hint_zh: str | None = None  # the same hint in Chinese, for the Chinese edition


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


def exercise(key: str, unit: str, hint: str, rel_tol: float = 0.02, hint_zh: str | None = None):
    """Register the decorated function as the kvlab computation of exercise `key`'s answer
    (`hint_zh`: the hint for the Chinese edition)."""

    def register(expected: Callable[[], float]) -> Callable[[], float]:
        _EXERCISES[key] = Exercise(key, unit, expected, hint, rel_tol, hint_zh)
        return expected

    return register


@exercise(
    "ch1.ceiling",
    "tokens/s",
    "the weight bytes (parameters x 2 bytes in fp16) and the bandwidth in bytes per second",
    hint_zh="权重字节数（fp16 下为参数量 × 2 字节）和以字节/秒计的带宽",
)
def _ceiling():
    return ARTICLE_BANDWIDTH_BYTES_PER_S / cost.weight_bytes("article-7b", "fp16")


@exercise(
    "ch1.ttft_ratio",
    "x",
    "the prefill FLOPs of the uncached tokens, including causal attention over the cached prefix",
    hint_zh="未缓存 token 的预填充 FLOP，包括它们对已缓存前缀所做的因果注意力",
)
def _ttft_ratio():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    miss = cost.prefill(d, 8192)
    hit = cost.prefill(d, 8192, cached_tokens=served_tokens(int(0.9 * 8192), 8192))
    return miss.ttft_s / hit.ttft_s


@exercise(
    "ch1.tpot_ms",
    "ms",
    "the bytes one decode step moves (weights + KV history); the hit rate does not enter TPOT",
    hint_zh="一个解码步搬运的字节（权重 + KV 历史）；命中率不影响 TPOT",
)
def _tpot_ms():
    return 1e3 * cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), 1, 8192).step_time_s


@exercise(
    "ch2.kv_per_token",
    "bytes",
    "the KV heads: Llama 2 7B uses full multi-head attention (32 KV heads), 2 bytes per element",
    hint_zh="KV 头数：Llama 2 7B 用的是完整的多头注意力（32 个 KV 头），每个元素 2 字节",
)
def _kv_token():
    return cost.kv_bytes_per_token("llama-2-7b", "fp16")


@exercise(
    "ch2.kv_equals_weights_batch",
    "sequences",
    "the weight bytes streamed per step and the KV bytes per token (Qwen2.5 7B has 4 KV heads)",
    hint_zh="每步读取的权重字节数和每个 token 的 KV 字节数（Qwen2.5 7B 有 4 个 KV 头）",
)
def _kv_equals_weights():
    s = cost.decode_step(Deployment("qwen2.5-7b", "h100-sxm"), 1, 8192)
    return s.weight_read_bytes / (8192 * s.kv_bytes_per_token)


@exercise(
    "ch2.int4_speedup",
    "x",
    "which term dominates the bytes at 16K x 8: int4 shrinks only the weights",
    hint_zh="16K × 8 时哪一项占了字节的大头：int4 只压缩权重",
)
def _int4_speedup():
    fp16 = cost.decode_step(Deployment("article-7b", "h100-sxm"), 8, 16384)
    int4 = cost.decode_step(Deployment("article-7b", "h100-sxm", "int4"), 8, 16384)
    return int4.tokens_per_s / fp16.tokens_per_s


@exercise(
    "ch2b.gemv_share",
    "",
    "the weight bytes (rows x columns x 2 in bf16) over the measured time at one token "
    "(m = 1), against the H100's data-sheet bandwidth (kvlab.hardware)",
    hint_zh="权重字节数（bf16 下为行数 × 列数 × 2）除以一个 token（m = 1）时的实测时间，"
    "再与 H100 数据手册上的带宽（kvlab.hardware）相比",
)
def _gemv_share():
    curve, _how = load("h100-sxm").gemm("bf16", 6144, 4096)
    return 6144 * 4096 * 2 / curve.scalar(1) / get_device("h100-sxm").memory_bandwidth_bytes_per_s


@exercise(
    "ch2b.measured_over_ceiling",
    "x",
    "the measured step time (speed=KernelTables(), bf16 weights and KV) over the same "
    "step's ceiling_step_time_s",
    hint_zh="实测的步时间（speed=KernelTables()，权重和 KV 均为 bf16）除以同一步的 "
    "ceiling_step_time_s",
)
def _measured_over_ceiling():
    d = Deployment("llama-3.1-8b", "h100-sxm", "bf16", "bf16", KernelTables())
    s = cost.decode_step(d, 16, 8192)
    return s.step_time_s / s.ceiling_step_time_s


@exercise(
    "ch2c.tokens_per_verify",
    "tokens",
    "(1 - A^(K+1)) / (1 - A): the accepted prefix of K drafted tokens plus the one token "
    "the verify pass always adds",
    hint_zh="(1 - A^(K+1)) / (1 - A)：K 个草稿 token 中被接受的前缀，"
    "加上验证那一遍总会多出的一个 token",
)
def _tokens_per_verify():
    return tokens_per_verify_step(0.8, 3)


@exercise(
    "ch2c.spec_breakeven_batch",
    "sequences",
    "the smallest batch whose speculative_speedup is at most 1 (bf16 weights and KV, "
    "a self-drafting head: no draft model)",
    hint_zh="speculative_speedup 不超过 1 的最小批大小"
    "（权重和 KV 均为 bf16，自带草稿头：没有草稿模型）",
)
def _spec_breakeven_batch():
    return float(
        breakeven_batch(Deployment("llama-3.1-8b", "h100-sxm", "bf16", "bf16"), 256, 8, 0.8)
    )


@exercise(
    "ch2c.tp2_max_batch",
    "sequences",
    "each GPU's memory after its half of the fp8 weights, over one sequence's KV per GPU "
    "(its 8 K/V heads split two ways, bf16)",
    hint_zh="每块 GPU 放下它那一半 fp8 权重后剩下的显存，除以一个序列在每块 GPU 上的 KV"
    "（8 个 K/V 头一分为二，bf16）",
)
def _tp2_max_batch():
    d = Deployment("llama-3.1-70b", "h100-sxm", "fp8", "bf16", tensor_parallel=2)
    return float(cost.decode_step(d, 1, 8192).max_batch)


@exercise(
    "ch2c.allreduce_over_sheet",
    "x",
    "the message (batch x hidden bf16 elements), the measured all-reduce over 8 GPUs at that "
    "size, and the ring's 2 (N - 1) / N of the message over the link's sheet bandwidth",
    hint_zh="消息大小（批大小 × hidden 个 bf16 元素）、8 块 GPU 在该大小下实测的 all-reduce 时间，"
    "以及环形算法的 2 (N - 1) / N 倍消息量除以链路的规格带宽",
)
def _allreduce_over_sheet():
    elements = 256 * get_model("llama-3.1-70b").hidden_size  # one bf16 activation per token
    sheet_s = 2 * (8 - 1) / 8 * 2 * elements / allreduce_link("h100-sxm", 8).bandwidth_bytes_per_s
    return load("h100-sxm").all_reduce(8).scalar(elements) / sheet_s


@exercise(
    "ch3.request_kv_mib",
    "MiB",
    "the KV bytes per token (2 x layers x KV heads x head_dim x 2 bytes) and MiB = 2**20 bytes",
    hint_zh="每个 token 的 KV 字节数（2 × 层数 × KV 头数 × head_dim × 2 字节），"
    "以及 MiB = 2**20 字节",
)
def _request_kv_mib():
    return 4096 * cost.kv_bytes_per_token("article-7b", "fp16") / 2**20


@exercise(
    "ch3.transfer_10gbe_s",
    "s",
    "the link's bytes per second: 10 Gb/s is 1.25e9 bytes/s, not 10e9",
    hint_zh="链路每秒传输的字节数：10 Gb/s 是 1.25e9 字节/秒，不是 10e9",
)
def _transfer_10gbe_s():
    d = Deployment("article-7b", "h100-sxm")
    return kv_fetch_time_s(d, 4096, TierPath("ethernet-10g", latency_s=0.0))


@exercise(
    "ch3.host_slowdown",
    "x",
    "the KV bytes read per step and the PCIe 5.0 x16 bandwidth (63 GB/s) against HBM's",
    hint_zh="每步读取的 KV 字节数，以及 PCIe 5.0 x16 的带宽（63 GB/s）与 HBM 带宽的对比",
)
def _host_slowdown():
    return tiered_decode_step(Deployment("article-7b", "h100-sxm"), 8, 4096, "host-pcie5").slowdown


@exercise(
    "ch4.transfer_over_prefill",
    "",
    "the KV bytes of 8,192 tokens over 25 GB/s (a 200 Gb/s NIC) against the prefill's FLOPs",
    hint_zh="8,192 个 token 的 KV 字节以 25 GB/s（一块 200 Gb/s 网卡）传输，对比预填充的 FLOP",
)
def _transfer_over_prefill():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    fetch_s = kv_fetch_time_s(d, 8192, TierPath("ib-200g", latency_s=0.0))
    return fetch_s / cost.prefill(d, 8192).time_s


@exercise(
    "ch4.remote_every_step",
    "x",
    "the whole KV history read over the NIC at every step, on top of the weights read from HBM",
    hint_zh="每一步都要经网卡读取完整的 KV 历史，此外还要从 HBM 读取权重",
)
def _remote_every_step():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    return tiered_decode_step(d, 1, 8192, "remote-ib-200g").slowdown


@exercise(
    "ch5.knee_16k",
    "sequences",
    "the batch at which the KV reads of a step reach the weight bytes (kvlab.cost.batch_knee)",
    hint_zh="一步的 KV 读取量追上权重字节数时的批大小（kvlab.cost.batch_knee）",
)
def _knee_16k():
    grid = np.array(BATCH_GRID)
    step = cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), grid, 16384)
    return float(grid[cost.batch_knee(step)])


@exercise(
    "ch5.fraction_of_ceiling",
    "",
    "the ceiling: batch x bandwidth / bytes per step, with the KV of all 8 sequences counted",
    hint_zh="上限：批大小 × 带宽 / 每步字节数，且要把全部 8 个序列的 KV 都算进去",
)
def _fraction_of_ceiling():
    return 600 / cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), 8, 16384).tokens_per_s


@exercise(
    "ch5b.unlimited_token_hit_ratio",
    "",
    "the replay's token hit ratio (prompt tokens served / all prompt tokens), not its "
    "request-level hit rate; a hit never serves a prompt's last token",
    hint_zh="回放的 token 命中率（由缓存提供的 prompt token / 全部 prompt token），"
    "而不是请求级命中率；命中从不提供 prompt 的最后一个 token",
)
def _unlimited_token_hit_ratio():
    return replay(trace_or_generated("conversation"), math.inf).token_hit_ratio


@exercise(
    "ch5b.request_over_token",
    "x",
    "the two definitions of a hit in the same replay: requests that found any cached block, "
    "against prompt tokens served",
    hint_zh="同一次回放中“命中”的两种定义：找到了任意已缓存块的请求，对比由缓存提供的 prompt token",
)
def _request_over_token():
    r = replay(trace_or_generated("conversation"), math.inf)
    return r.request_hit_rate / r.token_hit_ratio


def _exercises() -> dict[str, Exercise]:
    return dict(_EXERCISES)


def exercises() -> dict[str, Exercise]:
    return _exercises()


def check(key: str, answer) -> CheckResult:
    """Check an answer; returns a result that notebooks display (never raises on a wrong one).
    The verdict is in Chinese when the Chinese edition is built (kvlab.viz.i18n.chinese)."""
    ex = _exercises().get(key)
    if ex is None:
        raise unknown_name("exercise", key, _exercises())
    say = _chinese_verdicts if chinese() else _english_verdicts
    if answer is Ellipsis or answer is None:
        return CheckResult(key, False, say(ex, "blank"))
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return CheckResult(key, False, say(ex, "not a number", answer=answer))
    expected = ex.expected()
    if math.isfinite(value) and math.isclose(value, expected, rel_tol=ex.rel_tol):
        return CheckResult(key, True, say(ex, "correct", value=value))
    off = (value - expected) / expected if math.isfinite(value) else math.inf
    return CheckResult(key, False, say(ex, "wrong", value=value, off=off))


def _english_verdicts(
    ex: Exercise, kind: str, answer=None, value: float = 0.0, off: float = 0.0
) -> str:
    key = ex.key
    if kind == "blank":
        return (
            f"{key}: not answered yet. Replace `...` with your answer"
            f"{' in ' + ex.unit if ex.unit else ''}. Hint: work from {ex.hint}."
        )
    if kind == "not a number":
        return f"{key}: expected a number in {ex.unit}, got {answer!r}."
    if kind == "correct":
        return f"{key}: correct ({value:,.4g}{_unit(ex)})."
    direction = "high" if off > 0 else "low"
    return f"{key}: {value:,.4g}{_unit(ex)} is {abs(off):.0%} too {direction}. Recheck {ex.hint}."


#: Units of the exercises in Chinese: (as a unit's name, after a number); others stay.
UNITS_ZH = {"bytes": ("字节", " 字节"), "sequences": ("序列数", " 个序列"), "x": ("倍", " 倍")}


def _chinese_verdicts(
    ex: Exercise, kind: str, answer=None, value: float = 0.0, off: float = 0.0
) -> str:
    key, hint = ex.key, ex.hint_zh or ex.hint
    name, after = UNITS_ZH.get(ex.unit, (ex.unit, _unit(ex)))
    in_unit = f"（单位：{name}）" if ex.unit else ""
    if kind == "blank":
        return f"{key}：尚未作答。请把 `...` 换成你的答案{in_unit}。提示：{hint}。"
    if kind == "not a number":
        return f"{key}：这里要填一个数{in_unit}，收到的却是 {answer!r}。"
    if kind == "correct":
        return f"{key}：正确（{value:,.4g}{after}）。"
    direction = "偏高" if off > 0 else "偏低"
    return f"{key}：{value:,.4g}{after}，{direction}了 {abs(off):.0%}。请重新核对：{hint}。"


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


def write_student_copies(notebooks: list[Path], out_dir: Path, force: bool = False) -> list[Path]:
    """Write copies of the notebooks with answers blanked and outputs cleared.

    Nothing is written unless all of it can be: every notebook is read (a malformed one is
    named) and every target checked first. A target that is one of the source notebooks is
    refused even with `force`; any other existing file (a student's copy holds their
    answers) is replaced only with `force`. Each file is written atomically.
    """
    import nbformat

    out_dir = Path(out_dir)
    sources = {_resolved(p) for p in notebooks}
    plans = []
    for path in notebooks:
        nb = _read_notebook(path, nbformat)
        if _blank_notebook(nb):
            plans.append((out_dir / Path(path).name, nb, path))
    for target, _, _ in plans:
        _check_target(target, sources, force)
    if plans:
        _make_dirs(out_dir)
    written = []
    for target, nb, _ in plans:
        tmp = target.with_name(f".{target.name}.partial")
        try:
            nbformat.write(nb, str(tmp))
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise KvlabError(f"cannot write {target}: {exc.strerror or exc}") from None
        written.append(target)
    return written


def _resolved(path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(path).absolute()


def _read_notebook(path, nbformat):
    try:
        return nbformat.read(str(path), as_version=4)
    except OSError as exc:
        raise KvlabError(f"cannot read notebook {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - nbformat raises JSON, validation and key errors alike
        raise KvlabError(
            f"{path} is not a readable notebook ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def _blank_notebook(nb) -> int:
    """Blank the answers and clear the outputs in place; returns the cells that held answers."""
    blanked = 0
    cells = nb.get("cells")
    if not isinstance(cells, list):
        raise KvlabError("a notebook without a list of cells")
    for cell in cells:
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else str(source)
            new = blank_answers(source)
            blanked += new != source
            cell["source"] = new
            cell["outputs"], cell["execution_count"] = [], None
    return blanked


def _check_target(target: Path, sources: set, force: bool) -> None:
    if _resolved(target) in sources:
        raise KvlabError(
            f"refusing to write a student copy over the notebook it comes from "
            f"({target}): the reference answers would be lost; choose another output "
            "folder"
        )
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir() or not target.is_file():
        raise KvlabError(f"{target} exists and is not a file")
    if not force:
        raise KvlabError(
            f"{target} exists (it may hold a student's answers); pass --force to replace it"
        )


def _make_dirs(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise KvlabError(f"the output {out_dir} is a file, not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvlabError(f"cannot create {out_dir}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    """`python -m kvlab.labs [NOTEBOOK_DIR] [OUT_DIR] [--force]`: write the student copies."""
    parser = Parser(
        prog="python -m kvlab.labs",
        description="Write student copies of "
        "the chapter notebooks: answers blanked, outputs cleared.",
    )
    parser.add_argument("src", nargs="?", default="notebooks", help="folder of chapter notebooks")
    parser.add_argument(
        "out", nargs="?", default="labs", help="folder for the copies (default labs)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace files already there (a student copy holds answers)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    src, out = Path(args.src), Path(args.out)
    if not src.is_dir():
        raise KvlabError(f"{src} is not a folder of notebooks")
    if out.exists() and not out.is_dir():
        raise KvlabError(f"the output {out} is a file, not a folder")
    if _resolved(out) == _resolved(src) or _resolved(src) in _resolved(out).parents:
        raise KvlabError(
            f"refusing to write the student copies into {out}: it is (or is inside) "
            f"the notebook folder {src}, and the copies would replace the reference "
            "answers"
        )
    written = write_student_copies(sorted(src.glob("[0-9]*.ipynb")), out, force=args.force)
    for path in written:
        print(f"wrote {path}")
    if not written:
        raise KvlabError(f"no notebook in {src} holds an exercise (`# ANSWER` lines)")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main, "kvlab labs"))
