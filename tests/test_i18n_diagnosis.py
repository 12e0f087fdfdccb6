"""Chapter 5 in Chinese: the diagnosis reports (kvlab.diagnose writes them in English; the
presentation layer, kvlab.viz.metrics_and_diagnosis, renders them in the edition's language) and
the chapter's generated sentences. In English the reports read byte for byte as the domain
writes them; in Chinese every line reads in Chinese and states the same numbers."""

from __future__ import annotations

import html
import re
from collections import Counter

import pytest

from kvlab import cost, fmt
from kvlab.book import metrics_and_diagnosis as chapter
from kvlab.deployment import Deployment
from kvlab.diagnose import Diagnosis, diagnose
from kvlab.hardware import get_device
from kvlab.tiers import tiered_decode_step
from kvlab.viz import i18n
from kvlab.viz.metrics_and_diagnosis import DiagnosisReport, report_text

CJK = re.compile(r"[\u4e00-\u9fff]")
M, HW = "llama-3.1-8b", "h100-sxm"
D = Deployment(M, HW)


def _ceiling(batch: int, context: int) -> float:
    return cost.decode_step(D, batch, context).tokens_per_s


def _peak() -> float:
    return get_device(HW).memory_bandwidth_bytes_per_s


def _host() -> float:
    return tiered_decode_step(D, 8, 16384, "host-pcie5").tokens_per_s


def _cases() -> dict[str, Diagnosis]:
    """One diagnosis per wording kvlab.diagnose can write: every bound, every verdict and
    every piece of advice (tests below check that each one is reached)."""
    net = {"network_bandwidth_bytes_per_s": "ib-200g", "kv_bytes_per_request": 4096 * 131072}
    return {
        "bandwidth, KV dominates": diagnose(M, HW, 8, 16384, 0.9 * _ceiling(8, 16384)),
        "weights dominate, raise the batch": diagnose(M, HW, 1, 1024, 0.85 * _ceiling(1, 1024)),
        "overheads": diagnose(M, HW, 8, 4096, 0.2 * _ceiling(8, 4096)),
        "partly bandwidth-bound": diagnose(M, HW, 8, 4096, 0.5 * _ceiling(8, 4096)),
        "host tier": diagnose(M, HW, 8, 16384, 0.9 * _host(), kv_tier="host-pcie5"),
        "above the host tier": diagnose(M, HW, 8, 16384, 30, kv_tier="host-pcie5"),
        "network checked": diagnose(M, HW, 8, 4096, _ceiling(8, 4096), **net),
        "network-bound": diagnose(M, HW, 8, 4096, 0.1 * _ceiling(8, 4096), **net),
        "above the ceiling": diagnose(M, HW, 1, 4096, 3 * _ceiling(1, 4096)),
        "gaps between kernels": diagnose(
            M, HW, 8, 16384, 0.5 * _ceiling(8, 16384), measured_bandwidth_bytes_per_s=0.85 * _peak()
        ),
        "compute-bound": diagnose(M, HW, 1024, 16, 1000),
        "weights do not fit": diagnose("llama-3.1-70b", "l4", 1, 4096, 10),
        "weights fit at int8": diagnose("llama-3.1-70b", HW, 1, 4096, 10),
        "nothing fits, KV alone": diagnose("llama-3.1-70b", "rtx-3090", 64, 102400, 1),
        "tokens/s no memory moves": diagnose(M, HW, 1, 4096, 1e6),
        "weights dominate the host tier": diagnose(M, HW, 1, 1024, 50, kv_tier="host-pcie5"),
        "KV does not fit, past the knee": diagnose(M, HW, 512, 32768, 100),
        "knee does not fit": diagnose(M, "l4", 1, 4096, 10),
        "quantized already": diagnose(M, HW, 8, 16384, 100, weight_dtype="int4", kv_dtype="fp8"),
        "int4 weights, short context": diagnose(M, HW, 1, 1024, 100, weight_dtype="int4"),
    }


def _texts(d: Diagnosis) -> list[str]:
    """Every wording of a diagnosis (its memory fit too, which a report shows when it fails)."""
    shown = [d.fit, *d.findings]
    return [f"{d.bound}-bound"] + [t for f in shown for t in (f.check, f.verdict, *f.advice)]


def _numbers(text: str) -> Counter:
    return Counter(re.findall(r"\d+(?:[.,]\d+)*(?:e[+-]\d+)?", text))


@pytest.fixture(scope="module")
def cases() -> dict[str, Diagnosis]:
    return _cases()


@pytest.fixture
def chinese(monkeypatch):
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)


def test_the_cases_reach_every_bound_and_wording(cases):
    bounds = {d.bound for d in cases.values()}
    assert bounds == {
        "memory bandwidth",
        "compute",
        "KV tier",
        "network",
        "overheads",
        "launch and host overheads",
        "memory capacity",
    }
    texts = " | ".join(t for d in cases.values() for t in _texts(d))
    for fragment in (
        ": fits",
        "does NOT fit",
        "weights alone exceed",
        "that fits",
        "nothing fits on one l4",
        "with tensor parallelism",
        "not even 8 rtx-3090 GPUs",
        "one device with more memory",
        "the KV alone",
        "sequences fit beside the weights",
        "x the h100-sxm's peak memory bandwidth",
        "compute-bound at this batch",
        "kernels stream at",
        "memory bandwidth: bandwidth-bound",
        "partly bandwidth-bound",
        "the time goes elsewhere",
        "inferred from tokens/s",
        "launches and host work",
        "that the hardware allows",
        "stop tuning the scheduler",
        "headroom before physics",
        "look for stalls first",
        "(KV read from host-pcie5)",
        "weights are",
        "the KV history is",
        "quantize the weights to int4",
        "quantize the KV cache to fp8",
        "quantize the KV cache to fp8: ceiling 56.82 tokens/s with the KV still read from",
        "quantize the weights to int4: ceiling",
        "of the step's time",
        "a larger batch does not help",
        "starts to pace the step",
        "(fits)",
        "the most that fits",
        "past the knee",
        "the KV is read from HBM",
        "KV read every step from",
        "count hits by the tier",
        "not checked",
        "decode steps' worth",
        "layer by layer",
        "never read KV over the network",
    ):
        assert fragment in texts, fragment


def test_in_english_the_report_is_the_domains_byte_for_byte(cases):
    for title, d in cases.items():
        assert report_text(d) == d.report(), title
        assert repr(DiagnosisReport(title, d)) == f"{title}\n{d.report()}"


def _english_html(title: str, d: Diagnosis) -> str:
    """The report's HTML as the book showed it before it spoke Chinese (findings 1-5)."""
    items = []
    for f in d.findings:
        advice = "".join(f"<li>{html.escape(a)}</li>" for a in f.advice)
        items.append(
            f"<li><b>{html.escape(f.check)}</b>: {html.escape(f.verdict)}"
            + (f"<ul>{advice}</ul>" if advice else "")
            + "</li>"
        )
    return (
        f'<div class="kvlab-diagnosis"><p><b>{html.escape(title)}</b> — diagnosis: '
        f"<b>{html.escape(d.bound)}-bound</b></p><ol>{''.join(items)}</ol></div>"
    )


def test_the_english_html_is_unchanged_and_a_failed_fit_comes_first(cases):
    for title, d in cases.items():
        page = DiagnosisReport(title, d)._repr_html_()
        if d.fits:
            assert page == _english_html(title, d), title
        else:  # step 0 was left out of the HTML before; it leads, numbered from 0
            assert '<ol start="0"><li><b>memory fit</b>: does NOT fit' in page
            assert page.count("<li><b>") == 6


def test_every_wording_has_its_chinese(cases, chinese):
    texts = {t for d in cases.values() for t in _texts(d)}
    assert i18n.missing(texts) == [], f"add these to {i18n.CATALOGUE} (chapter 5)"
    assert all(CJK.search(i18n.t(t)) for t in texts), [
        t for t in texts if not CJK.search(i18n.t(t))
    ]


def test_the_chinese_report_states_the_english_numbers(cases, monkeypatch):
    english = {title: repr(DiagnosisReport(title, d)) for title, d in cases.items()}
    pages = {title: DiagnosisReport(title, d)._repr_html_() for title, d in cases.items()}
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    for title, d in cases.items():
        text = report_text(d)
        assert _numbers(text) == _numbers(d.report()), title
        lines = [line for line in text.splitlines() if line]
        assert all(CJK.search(line) for line in lines), title
        assert text.startswith("诊断：") and "：" in lines[1]
        assert (
            repr(DiagnosisReport(title, d)).endswith(text)
            and repr(DiagnosisReport(title, d)) != english[title]
        )
        page = DiagnosisReport(title, d)._repr_html_()
        assert "— 诊断：<b>" in page and page != pages[title]
        assert page.count("<li>") == pages[title].count("<li>")


def test_a_chinese_report_reads_as_written(cases, chinese):
    d = cases["host tier"]
    lines = report_text(d).splitlines()
    assert lines[0] == "诊断：KV 存储层级瓶颈"
    two = next(line for line in lines if line.startswith("2. "))
    assert two.startswith(f"2. 与上限的距离：{fmt.rate(0.9 * _host())} tokens/s，是上限的 90.0%，")
    assert two.endswith("（KV 从 host-pcie5 读取）")
    assert any(line.startswith("4. KV 存储层级：每步都从 host-pcie5 读取 KV：") for line in lines)


# ------------------------------------------------------------------ the chapter


def test_the_chapter_speaks_chinese_with_the_same_numbers(monkeypatch):
    english = chapter.numbers()
    reports = [repr(r) for r in chapter.diagnosis_reports()]
    assert english["diag_setup"] == (
        "Llama 3.1 8B on an NVIDIA H100 SXM5 80GB, batch 8, 16,384-token contexts"
    )
    assert reports[0].startswith("near the ceiling\nDiagnosis: memory bandwidth-bound\n")
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    chinese_numbers = chapter.numbers()
    assert chinese_numbers.keys() == english.keys()
    for key, text in english.items():
        assert _numbers(chinese_numbers[key]) == _numbers(text), key
    assert chinese_numbers["diag_setup"] == (
        "NVIDIA H100 SXM5 80GB 上的 Llama 3.1 8B，批大小 8，上下文 16,384 token"
    )
    assert i18n.missing(chapter.diagnosis_cases()) == []  # the cases' titles
    for english_report, report in zip(reports, chapter.diagnosis_reports(), strict=True):
        assert _numbers(repr(report)) == _numbers(english_report)
        assert CJK.search(repr(report).splitlines()[0])
