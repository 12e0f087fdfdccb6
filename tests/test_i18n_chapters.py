"""The Chinese edition's generated text for the translated chapters: the lab verdicts and the
chapters' printouts speak Chinese when the book is built in Chinese, with the same numbers,
and stay byte for byte as they were in English (nbval checks those)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from browser import ensure_site
from test_i18n import PENDING
from test_js import measured_states

from kvlab import labs
from kvlab.book import bandwidth_wall, past_the_ceiling, what_a_hit_saves
from kvlab.book.catalog import panels
from kvlab.viz import i18n
from kvlab.viz.panel import FORMATS

ROOT = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def chinese(monkeypatch):
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)


def _numbers(text: str) -> Counter:
    return Counter(re.findall(r"\d+(?:[.,]\d+)*(?:e[+-]\d+)?", text))


def test_english_verdicts_read_as_before():
    ex = labs.exercises()["ch2.kv_equals_weights_batch"]
    expected = ex.expected()
    assert labs.check(ex.key, ...).message == (
        f"{ex.key}: not answered yet. Replace `...` with your answer in sequences. "
        f"Hint: work from {ex.hint}."
    )
    assert labs.check(ex.key, expected).message == f"{ex.key}: correct ({expected:,.4g} sequences)."
    assert labs.check(ex.key, 2 * expected).message == (
        f"{ex.key}: {2 * expected:,.4g} sequences is 100% too high. Recheck {ex.hint}."
    )
    assert (
        labs.check("ch4.transfer_over_prefill", "x").message
        == "ch4.transfer_over_prefill: expected a number in , got 'x'."
    )


def test_chinese_verdicts_give_the_chinese_hint(chinese):
    ex = labs.exercises()["ch1.ceiling"]
    assert ex.hint_zh and CJK.search(ex.hint_zh)
    blank = labs.check(ex.key, ...)
    assert not blank.passed and "尚未作答" in blank.message and ex.hint_zh in blank.message
    assert "（单位：tokens/s）" in blank.message
    low = labs.check(ex.key, ex.expected() * 0.5)
    assert not low.passed and "偏低了 50%" in low.message and ex.hint_zh in low.message
    assert "偏高了 200%" in labs.check(ex.key, ex.expected() * 3).message
    right = labs.check(ex.key, ex.expected())
    assert right.passed and right.message == f"ch1.ceiling：正确（{ex.expected():,.4g} tokens/s）。"
    assert "收到的却是 'lots'" in labs.check(ex.key, "lots").message
    assert not labs.check(ex.key, float("nan")).passed
    knee = labs.exercises()["ch5.knee_16k"]
    assert labs.check(knee.key, knee.expected()).message.endswith("个序列）。")  # units in Chinese


def test_the_verdicts_state_the_same_numbers_in_both_languages(monkeypatch):
    answers = {
        key: [ex.expected(), next(o for o in ex.options if o != ex.expected()), "zz"]
        if ex.is_choice
        else [ex.expected(), ex.expected() * 0.7, ex.expected() * 4]
        for key, ex in labs.exercises().items()
    }
    english = {
        (k, i): labs.check(k, a).message for k, v in answers.items() for i, a in enumerate(v)
    }
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    for (key, i), message in english.items():
        chinese_message = labs.check(key, answers[key][i]).message
        ex = labs.exercises()[key]
        hint, hint_zh = ex.hint, ex.hint_zh or ""
        assert _numbers(chinese_message.replace(hint_zh, "")) == _numbers(
            message.replace(hint, "")
        ), (key, chinese_message)
        if ex.is_estimate and i == 2:  # a wrong estimate: the arithmetic in the language
            assert ex.rough()[2] in chinese_message and ex.rough()[1] in message


def test_a_hint_in_chinese_is_optional():
    """An exercise registered without `hint_zh` (a chapter not yet translated) still works in
    the Chinese edition, with its English hint."""
    registered = dict(labs._EXERCISES)
    try:
        labs.exercise("chx.untranslated", "ms", "the step time")(lambda: 2.0)
        assert labs.exercises()["chx.untranslated"].hint_zh is None
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(i18n.LANG_ENV, i18n.CHINESE)
            assert (
                labs.check("chx.untranslated", 1.0).message
                == "chx.untranslated：1 ms，偏低了 50%。请重新核对：the step time。"
            )
    finally:
        labs._EXERCISES.clear()
        labs._EXERCISES.update(registered)


def _exercises_by_page() -> dict[str, set[str]]:
    pages = {}
    for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        text = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        pages[f"notebooks/{notebook.stem}"] = {
            k for k in labs.exercises() if f'labs.check("{k}"' in text
        }
    return pages


def test_every_translated_chapter_has_chinese_hints():
    missing = [
        key
        for page, keys in _exercises_by_page().items()
        if page not in PENDING
        for key in sorted(keys)
        if not labs.exercises()[key].hint_zh
    ]
    assert missing == [], "give these exercises a hint_zh= in kvlab/labs.py"


def test_chapter_one_printout_in_both_languages(monkeypatch):
    english = what_a_hit_saves.worked_example()
    assert english.splitlines()[0].startswith("weights of the article's 7B in fp16: ")
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    chinese_text = what_a_hit_saves.worked_example()
    assert all(CJK.search(line) for line in chinese_text.splitlines())
    assert _numbers(chinese_text) == _numbers(english)


def test_chapter_2c_printout_and_published_words_in_both_languages(monkeypatch):
    english = past_the_ceiling.worked_example()
    assert english.splitlines()[0] == "llama-3.1-70b bf16 on H100s, batch 1, 4096-token context:"
    words = past_the_ceiling._published_magicdec()
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    chinese_text = past_the_ceiling.worked_example()
    assert all(CJK.search(line) for line in chinese_text.splitlines())
    assert _numbers(chinese_text) == _numbers(english)
    assert "放得下：否" in chinese_text and "放得下：是" in chinese_text
    chinese_words = past_the_ceiling._published_magicdec()
    assert chinese_words["magicdec_batches"] == "32 到 256"
    for key in ("magicdec_batches", "magicdec_gpus", "magicdec_source"):
        assert CJK.search(chinese_words[key]), key
        assert _numbers(chinese_words[key]) == _numbers(words[key]), key


def test_chapter_two_printout_and_worded_glue_in_both_languages(monkeypatch):
    """Chapter 2's printout and the glue values that are words (the bits-to-bytes and DDR5
    derivations, the papers' citations) read in Chinese with the English numbers."""
    english, english_glue = bandwidth_wall.worked_example(), bandwidth_wall.numbers()
    assert english.splitlines()[0] == "KV per token: 131,072 B; KV read at 4K: 536,870,912 B"
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    chinese_text, chinese_glue = bandwidth_wall.worked_example(), bandwidth_wall.numbers()
    assert all(CJK.search(line) for line in chinese_text.splitlines())
    assert _numbers(chinese_text) == _numbers(english)
    assert chinese_glue.keys() == english_glue.keys()
    for key in ("ddr5_derivation", "ib200_derivation", "kivi_source", "kvquant_source"):
        assert CJK.search(chinese_glue[key]), key
    assert all(_numbers(chinese_glue[k]) == _numbers(english_glue[k]) for k in english_glue)


def test_the_browser_translates_the_decode_step_panel_as_python_does(tmp_path, monkeypatch):
    """The texts chapter 2's panel sets on a change (the time chart's title, legends, the
    speed phrase), measured states included, read the same in the browser's table as in
    Python's: a template matches only when each of its slots translates ('Time per step
    (measured: X kernel tables, GPU)' also fits '{fw} kernel tables, {gpu}', whose first slot
    does not translate)."""

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    panel = panels()["ledger"]()
    texts = set()
    for state in [panel.default_state, *measured_states(panel)[::4]]:
        out = panel.compute(state)
        texts |= set(out["titles"].values())
        texts |= {FORMATS[kind](out["values"][k]) for k, _, kind in panel.readout if kind == "text"}
        texts |= {
            v
            for data in out["sources"].values()
            for col in data.values()
            for v in col
            if isinstance(v, str)
        }
    texts = sorted(texts)
    assert any(text.startswith("Time per step (measured: ") for text in texts)
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    script = tmp_path / "tr.js"
    script.write_text(
        "globalThis.window = globalThis;\n"
        "window.KVLAB = {FORMATS: {}, apply: () => 0};\n"
        + i18n.browser_js()
        + f"\nconsole.log(JSON.stringify({json.dumps(texts)}.map(window.KVLAB.tr)));\n"
    )
    run = subprocess.run([node, str(script)], capture_output=True, text=True, check=True)
    browser = json.loads(run.stdout)
    assert {e: b for e, b in zip(texts, browser, strict=True) if b != i18n.t(e)} == {}
    assert not any("measured" in text for text in browser)


def _math_blocks(page: Path) -> list[str]:
    return re.findall(
        r'<div class="math notranslate nohighlight">\s*(.*?)</div>',
        page.read_text(encoding="utf-8"),
        flags=re.S,
    )


@pytest.mark.browser
def test_display_math_survives_translation():
    """Each Chinese page has the English page's display formulas, as formulas (Sphinx's own
    translation step would turn a translated one into '::'; book/_ext/kvlab_i18n.py translates
    them first), and chapter 1's has its words in Chinese."""

    site = ensure_site()
    for english in sorted(site.glob("notebooks/*.html")):
        chinese_blocks = _math_blocks(site / "zh" / english.relative_to(site))
        assert len(chinese_blocks) == len(_math_blocks(english)), english.name
        assert all(
            block.strip().startswith(r"\[") and "::" not in block for block in chinese_blocks
        ), english.name
    (ceiling,) = _math_blocks(site / "zh" / "notebooks" / "01_what_a_hit_saves.html")
    # device memory bandwidth is 显存带宽 (内存 is host DRAM)
    assert r"\text{每秒 token 数}" in ceiling and r"\frac{\text{显存带宽}}" in ceiling
