"""Teaching labs: exercises whose answers kvlab checks, and student copies of the notebooks.

In a chapter notebook an exercise is one code cell:

    answer = 2e12 / cost.weight_bytes("article-7b")  # ANSWER
    labs.check("ch1.ceiling", answer)

The repository keeps the reference answer (a worked computation, nbval-tested); `make
labs` writes student copies in which every `# ANSWER` line becomes `answer = ...`. A
check within tolerance passes; a wrong or missing answer gets a hint naming the quantity
to recheck. The expected values come from kvlab, never from a typed number.

Three kinds of exercise teach a reasoning in three steps: an *estimate* by hand (checked
at a loose tolerance; a wrong one is shown the arithmetic, computed from kvlab's catalogues),
the *number* from kvlab (the exact answer), and a *choice*, one letter for why the two
agree or differ:

    answer = "b"  # ANSWER
    labs.check("ch3.host_why", answer)

The verdicts speak the reader's language: in the Chinese edition (KVLAB_BOOK_LANG=zh_CN,
kvlab.viz.i18n) they are written in Chinese, with the exercise's `hint_zh` (its English
hint where an exercise has none yet).
"""

from __future__ import annotations

import functools
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import cost, fmt
from .article import ARTICLE_BANDWIDTH_BYTES_PER_S
from .cli import Parser, guarded
from .deployment import Deployment, KernelTables
from .errors import KvlabError, unknown_name
from .grids import BATCH_GRID
from .hardware import get_device
from .kernel_tables import load
from .models import get_model
from .parallel import allreduce_link
from .plan import Job, Slo, Space, Workload, plan
from .prefix import replay
from .prompt import served_tokens
from .sim.costs import LedgerCost
from .speculative import breakeven_batch, speculative_step, tokens_per_verify_step
from .tiers import TierPath, get_placement, kv_fetch_time_s, tiered_decode_step
from .traces import find_trace, trace_or_generated, trace_stats
from .viz.i18n import chinese

ANSWER_MARK = "# ANSWER"
BLANK = "answer = ...  # your answer here"


@dataclass(frozen=True)
class Exercise:
    key: str
    unit: str
    expected: Callable[[], float | str]  # computed by kvlab (a choice: the right letter)
    hint: str  # the quantity to recheck
    rel_tol: float = 0.02
    hint_zh: str | None = None  # the same hint in Chinese, for the Chinese edition
    #: An estimate's arithmetic by hand: () -> (value, English, Chinese), from kvlab's
    #: catalogues; shown after a wrong estimate. None: not an estimate.
    rough: Callable[[], tuple[float, str, str]] | None = None
    options: tuple[str, ...] = ()  # a choice's letters; () for a number
    #: A choice that asks which way kvlab will come out before the reader runs it (its
    #: verdict says "kvlab finds", not "the reason").
    prediction: bool = False

    @property
    def is_choice(self) -> bool:
        return bool(self.options)

    @property
    def is_estimate(self) -> bool:
        return self.rough is not None


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


#: A loose tolerance: an estimate by hand, from round numbers, passes within it.
ESTIMATE_TOL = 0.3


def estimate(key: str, unit: str, hint: str, hint_zh: str, rough, of: str):
    """Register an estimate by hand of exercise `of`'s answer (the same kvlab value, checked
    within ESTIMATE_TOL); `rough` gives the arithmetic a wrong estimate is shown."""
    ex = _EXERCISES[of]
    _EXERCISES[key] = Exercise(key, unit, ex.expected, hint, ESTIMATE_TOL, hint_zh, rough)


def choice(key: str, options: str, hint: str, hint_zh: str, prediction: bool = False):
    """Register the decorated function as the right letter of a multiple-choice question
    (`options`: its letters, such as "abc"); kvlab computes it where the reason is a number.
    `prediction`: the question asks what kvlab will find, before the reader runs it."""

    def register(expected: Callable[[], str]) -> Callable[[], str]:
        _EXERCISES[key] = Exercise(
            key, "", expected, hint, 0.0, hint_zh, None, tuple(options), prediction
        )
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


def _ttft_rough() -> tuple[float, str, str]:

    prompt = 8192
    computed = prompt - served_tokens(int(0.9 * prompt), prompt)
    value = prompt / computed
    n, c, v = fmt.fixed(prompt, 0), fmt.fixed(computed, 0), fmt.sig(value, 3)
    return (
        value,
        f"a 90% hit leaves {c} of the {n} prompt tokens to compute: {n} / {c} ≈ {v}×",
        f"命中 90% 后，{n} 个 prompt token 中还剩 {c} 个要计算：{n} / {c} ≈ {v} 倍",
    )


estimate(
    "ch1.ttft_estimate",
    "x",
    "the share of the prompt's tokens that a 90% hit leaves to compute",
    "命中 90% 之后，prompt 中还要计算的 token 占多少",
    _ttft_rough,
    of="ch1.ttft_ratio",
)


@choice(
    "ch1.ttft_why",
    "abc",
    "what the uncached tokens compute: each attends to every token before it, cached or not",
    "未缓存的 token 要算什么：每一个都要对它之前的所有 token（无论是否已缓存）做注意力",
)
def _ttft_why():
    """(b) when the hit's prefill does more FLOPs per computed token than the full prefill:
    the uncached tokens sit at the end of the prompt and attend to all of it."""

    d = Deployment("llama-3.1-8b", "h100-sxm")
    miss = cost.prefill(d, 8192)
    hit = cost.prefill(d, 8192, cached_tokens=served_tokens(int(0.9 * 8192), 8192))
    per_token = (hit.flops / hit.computed_tokens) / (miss.flops / miss.computed_tokens)
    return "b" if per_token > 1 else "a"


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


def _int4_rough() -> tuple[float, str, str]:

    weights = cost.weight_bytes("article-7b", "fp16")
    kv = 8 * 16384 * cost.kv_bytes_per_token("article-7b", "fp16")
    value = (weights + kv) / (weights / 4 + kv)
    w, w4, k = fmt.si(weights, "B"), fmt.si(weights / 4, "B"), fmt.si(kv, "B")
    fp16, int4, v = fmt.si(weights + kv, "B"), fmt.si(weights / 4 + kv, "B"), fmt.sig(value, 3)
    return (
        value,
        f"KV: 8 x 16,384 tokens x {fmt.si(kv / 8 / 16384, 'B')} = {k}; fp16 step {w} + {k} = "
        f"{fp16}; int4 weights are a quarter, {w4}: {w4} + {k} = {int4}; {fp16} / {int4} ≈ {v}×",
        f"KV：8 × 16,384 个 token × {fmt.si(kv / 8 / 16384, 'B')} = {k}；fp16 时每步 {w} + {k} = "
        f"{fp16}；int4 权重只有四分之一，即 {w4}：{w4} + {k} = {int4}；{fp16} / {int4} ≈ {v} 倍",
    )


estimate(
    "ch2.int4_estimate",
    "x",
    "the bytes of one step before and after: weights (int4: a quarter of fp16) plus the KV "
    "of 8 sequences of 16,384 tokens, which int4 weights leave as they are",
    "量化前后一步的字节数：权重（int4 只有 fp16 的四分之一）加上 8 个 16,384 token 序列的 KV，"
    "而 KV 不受权重量化影响",
    _int4_rough,
    of="ch2.int4_speedup",
)


@choice(
    "ch2.int4_why",
    "abc",
    "which term is most of the bytes once the weights are int4, and which term int4 shrinks",
    "权重变成 int4 之后字节的大头是哪一项，而 int4 压缩的又是哪一项",
)
def _int4_why():
    """(b) when the step stays memory-bound and KV outweighs the int4 weights."""

    int4 = cost.decode_step(Deployment("article-7b", "h100-sxm", "int4"), 8, 16384)
    kv_dominates = int4.kv_read_bytes > int4.weight_read_bytes and int4.bound == "memory"
    return "b" if kv_dominates else "c"


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


def _measured_rough() -> tuple[float, str, str]:

    share = _gemv_share()
    value = 1 / share
    pct, v = fmt.percent(share), fmt.sig(value, 3)
    return (
        value,
        f"if every byte moved at the {pct} of the sheet bandwidth that the QKV product reached "
        f"in exercise 1, the step would take 1 / {pct} ≈ {v}× its ceiling",
        f"如果每个字节都以练习 1 中 QKV 乘法达到的规格带宽的 {pct} 搬运，"
        f"这一步就要花上限的 1 / {pct} ≈ {v} 倍",
    )


estimate(
    "ch2b.measured_estimate",
    "x",
    "the share of the sheet bandwidth a real kernel reaches (exercise 1): a step whose bytes all "
    "move at that share takes its ceiling divided by it",
    "真实内核能达到的规格带宽比例（练习 1）：如果一步的所有字节都按这个比例搬运，"
    "用时就是上限除以这个比例",
    _measured_rough,
    of="ch2b.measured_over_ceiling",
)


@choice(
    "ch2b.measured_why",
    "abc",
    "the share of the sheet bandwidth each of the step's kernels reaches: the large gate/up "
    "product and attention over 16 long contexts against the 6,144 x 4,096 QKV product",
    "这一步每个内核能达到的规格带宽比例：大的 gate/up 乘法和 16 条长上下文上的注意力，"
    "对比 6,144 × 4,096 的 QKV 乘法",
)
def _measured_why():
    """(a) when the step's largest GEMM reads closer to the sheet than the QKV product does."""

    tables, sheet = load("h100-sxm"), get_device("h100-sxm").memory_bandwidth_bytes_per_s
    gate_up, _how = tables.gemm("bf16", 28672, 4096)
    share = 28672 * 4096 * 2 / gate_up.scalar(16) / sheet
    return "a" if share > _gemv_share() else "c"


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


def _breakeven_rough() -> tuple[float, str, str]:

    d = Deployment("llama-3.1-8b", "h100-sxm", "bf16", "bf16")
    ridge = cost.decode_step(d, 1, 256).ridge_flops_per_byte
    tau = tokens_per_verify_step(0.8, 8)
    value = tau * ridge / 9
    r, t, v = fmt.sig(ridge, 3), fmt.sig(tau, 3), fmt.sig(value, 3)
    return (
        value,
        f"a verify pass multiplies the weights by 9 rows per sequence and turns compute-bound "
        f"at a batch of {r} / 9; beyond it, it costs 9 x batch / {r} plain steps and yields "
        f"(1 - 0.8^9) / (1 - 0.8) = {t} tokens: it stops paying at {t} x {r} / 9 ≈ {v}",
        f"验证前向让每个序列的 9 行乘以权重，在批大小为 {r} / 9 时变成受算力限制；"
        f"此后它的开销是 9 × 批大小 / {r} 个普通解码步，"
        f"而它产出 (1 - 0.8^9) / (1 - 0.8) = {t} 个 token：在 {t} × {r} / 9 ≈ {v} 时不再划算",
    )


estimate(
    "ch2c.breakeven_estimate",
    "sequences",
    "the batch at which a verify pass of K + 1 = 9 rows per sequence turns compute-bound "
    "(the ridge point over 9), and how many plain steps it then costs against the tokens "
    "it yields, (1 - A^(K+1)) / (1 - A)",
    "每个序列 K + 1 = 9 行的验证前向在多大的批上变成受算力限制（脊点除以 9），"
    "以及此后它花掉的普通解码步数与它产出的 token 数 (1 - A^(K+1)) / (1 - A) 之比",
    _breakeven_rough,
    of="ch2c.spec_breakeven_batch",
)


@choice(
    "ch2c.breakeven_why",
    "abc",
    "what a verify pass yields against what it costs once it is compute-bound: its cost "
    "grows with the batch, its yield per sequence does not shrink",
    "验证前向受算力限制之后，它的产出与开销之比：开销随批增长，每个序列的产出却不变",
)
def _breakeven_why():
    """(b) when speculation still pays at twice the batch at which the verify pass's GEMMs
    turn compute-bound (the ridge over K + 1)."""

    d = Deployment("llama-3.1-8b", "h100-sxm", "bf16", "bf16")
    ridge = cost.decode_step(d, 1, 256).ridge_flops_per_byte
    batch = int(2 * ridge / 9)
    s = speculative_step(d, batch, 256, 8, 0.8)
    return "b" if s.speculative_speedup > 1 else "a"


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


def _tp2_rough() -> tuple[float, str, str]:

    m = get_model("llama-3.1-70b")
    usable = get_device("h100-sxm").usable_capacity_bytes
    weights = cost.weight_bytes(m, "fp8") / 2
    kv_token = 2 * m.num_layers * (m.num_kv_heads // 2) * m.head_dim * 2
    kv_seq = 8192 * kv_token
    value = (usable - weights) / kv_seq
    u, w, room = fmt.si(usable, "B"), fmt.si(weights, "B"), fmt.si(usable - weights, "B")
    kv, v = fmt.si(kv_seq, "B"), fmt.sig(value, 3)
    layers, heads, dim = m.num_layers, m.num_kv_heads // 2, m.head_dim
    return (
        value,
        f"usable memory {u} - half of the fp8 weights {w} = {room}; one sequence's KV per GPU: "
        f"8,192 x 2 x {layers} layers x {heads} K/V heads x {dim} x 2 B = {kv}; "
        f"{room} / {kv} ≈ {v}",
        f"可用显存 {u} - 一半的 fp8 权重 {w} = {room}；一个序列在每块 GPU 上的 KV："
        f"8,192 × 2 × {layers} 层 × {heads} 个 K/V 头 × {dim} × 2 B = {kv}；{room} / {kv} ≈ {v}",
    )


estimate(
    "ch2c.tp2_estimate",
    "sequences",
    "each GPU's usable memory less half of the fp8 weights, over one sequence's KV on one "
    "GPU (half of its K/V heads, bf16)",
    "每块 GPU 的可用显存减去一半的 fp8 权重，再除以一个序列在一块 GPU 上的 KV"
    "（K/V 头的一半，bf16）",
    _tp2_rough,
    of="ch2c.tp2_max_batch",
)


@choice(
    "ch2c.tp_why",
    "abc",
    "what a GPU holds at TP2 and at TP4: its share of the weights and each sequence's share "
    "of the KV both halve",
    "TP2 和 TP4 时每块 GPU 各放了什么：它分到的权重和每个序列分到的 KV 都减半",
)
def _tp_why():
    """(b) when four GPUs fit more than twice the sequences two do."""

    def fit(tp):
        d = Deployment("llama-3.1-70b", "h100-sxm", "fp8", "bf16", tensor_parallel=tp)
        return cost.decode_step(d, 1, 8192).max_batch

    return "b" if fit(4) > 2 * fit(2) else "a"


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


def _host_rough() -> tuple[float, str, str]:

    kv = 8 * 4096 * cost.kv_bytes_per_token("article-7b", "fp16")
    weights = cost.weight_bytes("article-7b", "fp16")
    pcie = get_placement("host-pcie5").bandwidth_bytes_per_s()
    hbm = get_device("h100-sxm").memory_bandwidth_bytes_per_s
    t_pcie, t_hbm = kv / pcie, (weights + kv) / hbm
    value = t_pcie / t_hbm
    k, w = fmt.si(kv, "B"), fmt.si(weights, "B")
    tp, th, v = fmt.seconds(t_pcie), fmt.seconds(t_hbm), fmt.sig(value, 3)
    link, mem = fmt.si(pcie, "B/s"), fmt.si(hbm, "B/s")
    return (
        value,
        f"KV per step 8 x 4,096 tokens = {k}; over PCIe at {link}: {tp}; the whole step from "
        f"HBM ({w} + {k} at {mem}): {th}; {tp} / {th} ≈ {v}×",
        f"每步的 KV 为 8 × 4,096 个 token = {k}；经 PCIe 以 {link} 传输：{tp}；整步都从 HBM 读"
        f"（{w} + {k}，{mem}）：{th}；{tp} / {th} ≈ {v} 倍",
    )


estimate(
    "ch3.host_estimate",
    "x",
    "the KV bytes a step reads (8 sequences x 4,096 tokens) over PCIe 5.0, against the whole "
    "step (weights + KV) read from HBM",
    "一步读取的 KV 字节（8 个序列 × 4,096 个 token）经 PCIe 5.0 传输的时间，"
    "对比整步（权重 + KV）从 HBM 读取的时间",
    _host_rough,
    of="ch3.host_slowdown",
)


@choice(
    "ch3.host_why",
    "abc",
    "which bytes cross PCIe at every step, and which ones int4 weights shrink",
    "每一步经 PCIe 传的是哪些字节，而 int4 权重压缩的又是哪些",
)
def _host_why():
    """(b) when int4 weights buy under 10% with the KV read from host memory."""

    def tps(weights):
        d = Deployment("article-7b", "h100-sxm", weights)
        return tiered_decode_step(d, 8, 4096, "host-pcie5").tokens_per_s

    return "b" if tps("int4") < 1.1 * tps("fp16") else "a"


@exercise(
    "ch4.transfer_over_prefill",
    "",
    "the KV bytes of 8,192 tokens over 50 GB/s (a 400 Gb/s NIC) against the prefill's FLOPs",
    hint_zh="8,192 个 token 的 KV 字节以 50 GB/s（一块 400 Gb/s 网卡）传输，对比预填充的 FLOP",
)
def _transfer_over_prefill():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    fetch_s = kv_fetch_time_s(d, 8192, TierPath("ib-400g", latency_s=0.0))
    return fetch_s / cost.prefill(d, 8192).time_s


@exercise(
    "ch4.remote_every_step",
    "x",
    "the whole KV history read over the NIC at every step, on top of the weights read from HBM",
    hint_zh="每一步都要经网卡读取完整的 KV 历史，此外还要从 HBM 读取权重",
)
def _remote_every_step():
    d = Deployment("llama-3.1-8b", "h100-sxm")
    return tiered_decode_step(d, 1, 8192, "remote-ib-400g").slowdown


def _remote_rough() -> tuple[float, str, str]:

    step = cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), 1, 8192)
    nic = get_placement("remote-ib-400g").bandwidth_bytes_per_s()
    t_nic = step.kv_read_bytes / nic
    value = (t_nic + step.step_time_s) / step.step_time_s
    k, link, tn = fmt.si(step.kv_read_bytes, "B"), fmt.si(nic, "B/s"), fmt.seconds(t_nic)
    b, mem = fmt.si(step.step_bytes, "B"), fmt.si(step.bandwidth_bytes_per_s, "B/s")
    th, v = fmt.seconds(step.step_time_s), fmt.sig(value, 3)
    return (
        value,
        f"the KV of 8,192 tokens, {k}, over the NIC at {link}: {tn}; the step from HBM, {b} at "
        f"{mem}: {th}; ({tn} + {th}) / {th} ≈ {v}×",
        f"8,192 个 token 的 KV（{k}）经网卡以 {link} 传输：{tn}；从 HBM 读的一步（{b}，{mem}）："
        f"{th}；({tn} + {th}) / {th} ≈ {v} 倍",
    )


estimate(
    "ch4.remote_estimate",
    "x",
    "the KV of 8,192 tokens over one 400 Gb/s NIC (in bytes per second) added to the step "
    "read from HBM",
    "8,192 个 token 的 KV 经一块 400 Gb/s 网卡传输的时间（按字节/秒换算），加上从 HBM 读的那一步",
    _remote_rough,
    of="ch4.remote_every_step",
)


@choice(
    "ch4.remote_why",
    "abc",
    "how often decode reads the KV history: at every step, all of it",
    "解码多久读一次 KV 历史：每一步，全部读一遍",
)
def _remote_why():
    """(b) when reading the KV remotely at every step costs more than moving it once and
    decoding the next token locally."""

    d = Deployment("llama-3.1-8b", "h100-sxm")
    s = tiered_decode_step(d, 1, 8192, "remote-ib-400g")
    once = kv_fetch_time_s(d, 8192, TierPath("remote-ib-400g", latency_s=0.0))
    return "b" if 2 * s.step_time_s > once + 2 * s.hbm_step_time_s else "a"


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


def _knee_rough() -> tuple[float, str, str]:

    step = cost.decode_step(Deployment("llama-3.1-8b", "h100-sxm"), 1, 16384)
    value = step.weight_read_bytes / step.kv_read_bytes
    w, k, v = (
        fmt.si(step.weight_read_bytes, "B"),
        fmt.si(step.kv_read_bytes, "B"),
        fmt.sig(value, 3),
    )
    per = fmt.si(step.kv_bytes_per_token, "B")
    return (
        value,
        f"one sequence's KV: 16,384 tokens x {per} = {k}; it equals the {w} of weights a step "
        f"reads at a batch of {w} / {k} ≈ {v}",
        f"一个序列的 KV：16,384 个 token × {per} = {k}；当批大小为 {w} / {k} ≈ {v} 时，"
        f"它就等于一步读取的 {w} 权重",
    )


estimate(
    "ch5.knee_estimate",
    "sequences",
    "the weight bytes a step reads, over the KV bytes of one sequence of 16,384 tokens",
    "一步读取的权重字节数，除以一个 16,384 token 序列的 KV 字节数",
    _knee_rough,
    of="ch5.knee_16k",
)


@choice(
    "ch5.knee_why",
    "abc",
    "the bytes per token of a step as the batch grows: the weights are shared, each "
    "sequence's KV is not",
    "批增大时一步中每个 token 摊到的字节：权重是共享的，每个序列的 KV 不是",
)
def _knee_why():
    """(b) when a huge batch's throughput is at most twice the knee's (memory-bound)."""

    grid = np.array(BATCH_GRID)
    d = Deployment("llama-3.1-8b", "h100-sxm")
    steps = cost.decode_step(d, grid, 16384)
    knee = cost.batch_knee(steps)
    huge = cost.decode_step(d, 1_000_000, 16384)
    return "b" if huge.tokens_per_s <= 2 * np.asarray(steps.tokens_per_s)[knee] else "a"


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


def _request_over_token_rough() -> tuple[float, str, str]:

    stats = trace_stats(trace_or_generated("conversation"))
    value = stats.shared_prefix_share / stats.reusable_token_share
    shared = fmt.percent(stats.shared_prefix_share, 4)
    tokens = fmt.percent(stats.reusable_token_share)
    v = fmt.sig(value, 3)
    return (
        value,
        f"an unlimited cache finds a block for about every request that begins with a shared "
        f"block ({shared}) and serves the reusable tokens ({tokens}): {shared} / {tokens} ≈ {v}×",
        f"不限容量的缓存，几乎为每个以共享块开头的请求（{shared}）都找到一个块，"
        f"而它提供的是可复用的 token（{tokens}）：{shared} / {tokens} ≈ {v} 倍",
    )


estimate(
    "ch5b.request_over_token_estimate",
    "x",
    "the chapter's two figures for the trace: the share of requests that begin with a shared "
    "block, and the share of prompt tokens that any cache could reuse",
    "本章给出的两个数：以共享块开头的请求占比，以及任何缓存最多能复用的 prompt token 占比",
    _request_over_token_rough,
    of="ch5b.request_over_token",
)


@choice(
    "ch5b.hit_why",
    "abc",
    "what requests share: a short beginning (a system prompt), then prompts of their own",
    "请求之间共享的是什么：一段很短的开头（系统提示词），之后就各不相同",
)
def _hit_why():
    """(b) when nearly every request hits and the request-level rate is far above the token
    hit ratio (on the real trace and on its generated stand-in alike)."""

    r = replay(trace_or_generated("conversation"), math.inf)
    return "b" if r.request_hit_rate > 0.9 and r.request_hit_rate > 1.5 * r.token_hit_ratio else "a"


# ------------------------------------------------------------------ chapter 6
#: The planning lab's search: Llama 3.1 70B on 8 H200s (141 GB each: at TP2 the weights now
#: leave room for KV), one instance shape per tensor-parallel degree (colocated,
#: prefill-first), the chapter's SLOs and traffic (600 requests from 15 minutes into the
#: conversation trace).
LAB_PLAN_MODEL, LAB_PLAN_HARDWARE, LAB_PLAN_GPUS = "llama-3.1-70b", "h200", 8
LAB_PLAN_TP = (2, 4, 8)
LAB_PLAN_TTFT_S, LAB_PLAN_TBT_S = 10.0, 0.03
LAB_PLAN_START_S, LAB_PLAN_REQUESTS = 900.0, 600


def lab_plan_trace() -> str:
    """The conversation trace when this machine has it, else its generated stand-in."""

    return "conversation" if find_trace("conversation") is not None else "generated:conversation"


@functools.cache
def lab_plan() -> dict:
    """`kvlab plan` as the lab's reader runs it (kvlab.plan.plan, in this process)."""

    return plan(
        Job(LAB_PLAN_MODEL, Slo(ttft_s=LAB_PLAN_TTFT_S, tbt_s=LAB_PLAN_TBT_S)),
        Workload(lab_plan_trace(), start_s=LAB_PLAN_START_S, requests=LAB_PLAN_REQUESTS),
        {LAB_PLAN_HARDWARE: LAB_PLAN_GPUS},
        Space(archs=("colocated",), schedulers=("prefill-first",), tensor_parallel=LAB_PLAN_TP),
        runner="serial",
    )


def _lab_per_gpu() -> dict:
    return {r["tensor_parallel"]: r for r in lab_plan()["designs"]}


def _lab_prefill_s(tp: int) -> tuple[float, float]:
    """(seconds, tokens): the ledger's prefill of the lab slice's median prompt at TP `tp`
    (all-reduces in)."""

    slice_ = Workload(lab_plan_trace(), start_s=LAB_PLAN_START_S, requests=LAB_PLAN_REQUESTS)
    tokens = float(np.median(slice_.traces()[0].input_tokens))
    d = Deployment(LAB_PLAN_MODEL, LAB_PLAN_HARDWARE, tensor_parallel=tp)
    return float(np.asarray(LedgerCost(d, max_batch=256).prefill_times_s(tokens, 0.0)[0])), tokens


@choice(
    "ch6.tp_predict",
    "abc",
    "what a TP8 step gains over a TP4 step (chapter 2c), and what a slower prefill does to "
    "TTFT when prompts arrive in bursts",
    "TP8 的一步比 TP4 快多少（第 2c 章），以及当 prompt 成批到达时，更慢的预填充对 TTFT 意味着什么",
    prediction=True,
)
def _tp_predict():
    """The tensor-parallel degree of the lab search's best design: a TP2, b TP4, c TP8."""
    return {2: "a", 4: "b", 8: "c"}[lab_plan()["best"]["tensor_parallel"]]


@exercise(
    "ch6.tp8_over_tp4",
    "x",
    "the best TP8 design's requests/s per GPU over the best TP4 design's, both from the search",
    hint_zh="搜索结果里 TP8 最佳设计的每 GPU 请求/秒，除以 TP4 最佳设计的",
)
def _tp8_over_tp4():
    rows = _lab_per_gpu()
    return rows[8]["requests_per_s_per_gpu"] / rows[4]["requests_per_s_per_gpu"]


def _tp8_rough() -> tuple[float, str, str]:
    t4, tokens = _lab_prefill_s(4)
    t8, _ = _lab_prefill_s(8)
    value = t4 / t8 / 2
    n, a, b, v = fmt.fixed(tokens, 0), fmt.seconds(t4), fmt.seconds(t8), fmt.sig(value, 3)
    return (
        value,
        f"a TP4 instance prefills the median prompt ({n} tokens) in {a}, a TP8 instance in "
        f"{b}: {fmt.sig(t4 / t8, 3)}× as fast on twice the GPUs, so per GPU {a} / {b} / 2 ≈ {v}",
        f"TP4 实例预填充中位数 prompt（{n} 个 token）要 {a}，TP8 实例要 {b}：用两倍的 GPU 只快 "
        f"{fmt.sig(t4 / t8, 3)} 倍，所以每 GPU 是 {a} / {b} / 2 ≈ {v}",
    )


estimate(
    "ch6.tp8_over_tp4_estimate",
    "x",
    "the ledger's prefill time of the median prompt at TP4 and at TP8 "
    "(kvlab.sim.costs.LedgerCost), and that a TP8 instance takes twice the GPUs",
    "账本给出的中位数 prompt 在 TP4 和 TP8 下的预填充时间（kvlab.sim.costs.LedgerCost），"
    "以及一个 TP8 实例要占两倍的 GPU",
    _tp8_rough,
    of="ch6.tp8_over_tp4",
)


@choice(
    "ch6.tp8_why",
    "abc",
    "how much faster a step gets when the same model is split over twice the GPUs",
    "同一个模型切到两倍的 GPU 上时，一步能快多少",
)
def _tp8_why():
    """(b) when TP8 is not pruned and a TP8 prefill is less than twice as fast as TP4's."""
    t4, _ = _lab_prefill_s(4)
    t8, _ = _lab_prefill_s(8)
    return "b" if 8 in _lab_per_gpu() and t4 / t8 < 2 else "a"


@choice(
    "ch6.tp2_why",
    "abc",
    "what binds just past the TP2 design's saturation, and how long one of its instances "
    "takes to prefill the prompts of a burst",
    "TP2 设计刚过饱和点时是什么先超限，以及它的一个实例预填充一批 prompt 要多久",
)
def _tp2_why():
    """(b) when TP2 fits, TTFT binds past its saturation, it neither rejects nor preempts at
    saturation, and per GPU it prefills faster than TP4 (so throughput is not why)."""
    row = _lab_per_gpu().get(2)
    if row is None or row["saturation_requests_per_s"] <= 0:
        return "a"
    t2, _ = _lab_prefill_s(2)
    t4, _ = _lab_prefill_s(4)
    ttft = "ttft" in (row["limit"] or {}).get("binds", "")
    clean = not row["preemptions"] and not row["requests_rejected"]
    return "b" if ttft and clean and 2 * t4 / t2 > 1 else "a"


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
    say = functools.partial(_verdict, "zh" if chinese() else "en")
    if answer is Ellipsis or answer is None:
        return CheckResult(key, False, say(ex, "blank"))
    if ex.is_choice:
        return _check_choice(ex, answer, say)
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return CheckResult(key, False, say(ex, "not a number", answer=answer))
    expected = ex.expected()
    if math.isfinite(value) and math.isclose(value, expected, rel_tol=ex.rel_tol):
        return CheckResult(key, True, say(ex, "correct", value=value, expected=expected))
    off = (value - expected) / expected if math.isfinite(value) else math.inf
    return CheckResult(key, False, say(ex, "wrong", value=value, off=off))


def _check_choice(ex: Exercise, answer, say) -> CheckResult:
    """A letter, in either case, with or without parentheses: '(b)', 'B', 'b'."""
    letter = answer.strip().strip("()").strip().lower() if isinstance(answer, str) else None
    if letter not in ex.options:
        return CheckResult(ex.key, False, say(ex, "not a letter", answer=answer))
    if letter == ex.expected():
        return CheckResult(ex.key, True, say(ex, "right letter", answer=letter))
    return CheckResult(ex.key, False, say(ex, "wrong letter", answer=letter))


def _letters(ex: Exercise, last: str, sep: str = ", ") -> str:
    """'"a", "b" or "c"' (in Chinese '"a"、"b" 或 "c"')."""
    quoted = [f'"{o}"' for o in ex.options]
    return sep.join(quoted[:-1]) + f" {last} " + quoted[-1]


#: A verdict's words in each edition, by kind; `_verdict` picks the kind and fills the fields.
VERDICTS = {
    "en": {
        "blank": "{key}: not answered yet. Replace `...` with {what}{in_unit}. "
        "Hint: work from {hint}.",
        "not a letter": "{key}: answer with one letter, {letters}; got {answer!r}.",
        "right letter": "{key}: correct ({answer}).",
        "wrong prediction": "{key}: ({answer}) is not what kvlab finds. Think again about {hint}.",
        "wrong letter": "{key}: ({answer}) is not the reason. Recheck {hint}.",
        "not a number": "{key}: expected a number in {unit}, got {answer!r}.",
        "good estimate": "{key}: a good estimate ({value:,.4g}{after}; kvlab's exact figure is "
        "{expected:,.4g}{after}).",
        "correct": "{key}: correct ({value:,.4g}{after}).",
        "wrong": "{key}: {value:,.4g}{after} is {off:.0%} too {direction}. "
        "Recheck {hint}.{arithmetic}",
    },
    "zh": {
        "blank": "{key}：尚未作答。请把 `...` 换成{what}{in_unit}。提示：{hint}。",
        "not a letter": "{key}：请用一个字母作答（{letters}），收到的却是 {answer!r}。",
        "right letter": "{key}：正确（{answer}）。",
        "wrong prediction": "{key}：kvlab 得出的不是（{answer}）。请再想想：{hint}。",
        "wrong letter": "{key}：（{answer}）不是原因。请重新核对：{hint}。",
        "not a number": "{key}：这里要填一个数{in_unit}，收到的却是 {answer!r}。",
        "good estimate": "{key}：估得不错（{value:,.4g}{after}；kvlab 的精确值是 "
        "{expected:,.4g}{after}）。",
        "correct": "{key}：正确（{value:,.4g}{after}）。",
        "wrong": "{key}：{value:,.4g}{after}，{direction}了 {off:.0%}。请重新核对：{hint}。"
        "{arithmetic}",
    },
}

#: The pieces a verdict is built from, in each edition: how options are listed ("or", the
#: separator), what to answer, a unit after "in", the directions, and the arithmetic line
#: (with the index of `Exercise.rough()`'s text in that language).
_VERDICT_PARTS = {
    "en": {
        "letters": ("or", ", "),
        "choice": "one of {letters}",
        "free": "your answer",
        "in_unit": " in {name}",
        "directions": ("high", "low"),
        "arithmetic": (" The arithmetic: {}.", 1),
    },
    "zh": {
        "letters": ("或", "、"),
        "choice": "{letters} 中的一个字母",
        "free": "你的答案",
        "in_unit": "（单位：{name}）",
        "directions": ("偏高", "偏低"),
        "arithmetic": ("算式：{}。", 2),
    },
}

#: Units of the exercises in Chinese: (as a unit's name, after a number); others stay.
UNITS_ZH = {"bytes": ("字节", " 字节"), "sequences": ("序列数", " 个序列"), "x": ("倍", " 倍")}


def _verdict(lang: str, ex: Exercise, kind: str, **given) -> str:
    """The verdict of `kind` on an answer to `ex`, in the edition `lang` ("en" or "zh").
    `given`: what the check found, as its kind needs it (answer; value, expected; off, the
    value's relative distance from the expected one)."""
    parts = _VERDICT_PARTS[lang]
    name, after = (ex.unit, _unit(ex))
    if lang == "zh":
        name, after = UNITS_ZH.get(ex.unit, (name, after))
    letters = _letters(ex, *parts["letters"]) if ex.is_choice else ""
    if kind == "wrong letter" and ex.prediction:
        kind = "wrong prediction"
    if kind == "correct" and ex.is_estimate:
        kind = "good estimate"
    off = given.pop("off", 0.0)
    arithmetic = ""
    if kind == "wrong" and ex.is_estimate:
        line, index = parts["arithmetic"]
        arithmetic = line.format(ex.rough()[index])
    return VERDICTS[lang][kind].format(
        key=ex.key,
        unit=ex.unit,
        hint=(ex.hint_zh or ex.hint) if lang == "zh" else ex.hint,
        what=(parts["choice"] if ex.is_choice else parts["free"]).format(letters=letters),
        in_unit=parts["in_unit"].format(name=name) if ex.unit else "",
        letters=letters,
        after=after,
        off=abs(off),
        direction=parts["directions"][0 if off > 0 else 1],
        arithmetic=arithmetic,
        **given,
    )


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
    notebooks = sorted(src.glob("*.ipynb"))  # any name: chapters, a teacher's own labs
    if not notebooks:
        raise KvlabError(f"{src} holds no notebook (*.ipynb)")
    written = write_student_copies(notebooks, out, force=args.force)
    for path in written:
        print(f"wrote {path}")
    if not written:
        raise KvlabError(
            f"none of the {len(notebooks)} notebooks in {src} holds an exercise (a cell with "
            f"an `answer = ...  {ANSWER_MARK}` line)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main, "kvlab labs"))
