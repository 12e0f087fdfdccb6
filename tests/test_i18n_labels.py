"""The Chinese label table is a gettext catalogue (kvlab/viz/locale/zh_CN/LC_MESSAGES/
kvlab-labels.po) read through `gettext` by kvlab.viz.po: nothing lost on the way, the
templates' order kept, and the reader agrees with msgfmt and babel where they are here."""

from __future__ import annotations

import gettext
import io
import shutil
import subprocess
import sys

import pytest

from kvlab.viz import i18n, po

#: The counts when the table moved out of kvlab/viz/i18n_zh.py (518 entries): it may grow.
KEPT_NAMES, LABELS, TEMPLATES = 11, 425, 82


def test_every_entry_of_the_catalogue_loads():
    text = i18n.CATALOGUE.read_text(encoding="utf-8")
    in_file = text.count('\nmsgid "') - 1  # less the header
    keep, table, patterns = i18n.labels()
    assert len(keep) + len(table) + len(patterns) == in_file
    assert len(keep) >= KEPT_NAMES and len(table) >= LABELS and len(patterns) >= TEMPLATES
    assert (i18n.KEEP, i18n.ZH, i18n.PATTERNS) == (keep, table, patterns)


def test_known_labels_translate(monkeypatch):
    assert i18n.ZH["Speed"] == "速度"
    assert i18n.ZH["device memory"] == "显存"
    assert i18n.ZH["Batch"] == "批大小"
    assert i18n.ZH["Roofline"] == "Roofline"
    assert {"TTFT", "TPOT", "conversation", "aiconfigurator-core 0.12.0"} <= i18n.KEEP
    assert i18n.PATTERNS[0] == ("{trace} (generated)", "{trace}（生成的）")
    monkeypatch.setenv(i18n.LANG_ENV, i18n.CHINESE)
    assert i18n.t("What limits the batch") == "限制批大小的是"
    assert i18n.t("conversation (generated)") == "conversation（生成的）"  # a template + a name
    assert i18n.t("Speed: device memory") == "速度：显存"


def test_templates_keep_the_catalogues_order():
    """First match wins: the specific templates come before the general '{a}: {b}'."""
    order = [english for english, _ in i18n.PATTERNS]
    assert order.index("{title}: {trace} [{window}]") < order.index("{a}: {b}")
    assert order[-1].startswith("median of weight bytes / latency")


SAMPLE = r"""# a comment
msgid ""
msgstr ""
"Language: zh_CN\n"
"Content-Type: text/plain; charset=UTF-8\n"

#. a translator comment
msgctxt "pattern"
msgid "say \"{a}\"\\"
msgstr "说“{a}”\\"

msgid ""
"two\n"
"lines"
msgstr "两\n行"

#, fuzzy
msgid "doubtful"
msgstr "存疑"

msgid "untranslated"
msgstr ""
"""


def test_escapes_contexts_and_what_gettext_leaves_out():
    entries = po.parse(SAMPLE)
    assert [(e.context, e.msgid, e.msgstr, e.fuzzy) for e in entries[1:]] == [
        ("pattern", 'say "{a}"\\', "说“{a}”\\", False),
        (None, "two\nlines", "两\n行", False),
        (None, "doubtful", "存疑", True),
        (None, "untranslated", "", False),
    ]
    translations = gettext.GNUTranslations(io.BytesIO(po.mo_bytes(entries)))
    assert translations.pgettext("pattern", 'say "{a}"\\') == "说“{a}”\\"
    assert translations.gettext("two\nlines") == "两\n行"
    assert translations.gettext("doubtful") == "doubtful"  # fuzzy: not used, as msgfmt
    assert translations.gettext("untranslated") == "untranslated"


@pytest.mark.parametrize("bad", ['msgid "a\\q"\nmsgstr ""', 'msgid "a"\nmsgstr[0] "b"'])
def test_what_the_reader_refuses(bad):
    with pytest.raises(ValueError):
        po.parse(bad)


def test_the_reader_agrees_with_babel():
    pofile = pytest.importorskip("babel.messages.pofile")
    catalog = pofile.read_po(io.StringIO(i18n.CATALOGUE.read_text(encoding="utf-8")))
    theirs = [(m.context, m.id, m.string) for m in catalog if m.id]
    ours = [
        (e.context, e.msgid, e.msgstr)
        for e in po.parse(i18n.CATALOGUE.read_text(encoding="utf-8"))[1:]
    ]
    assert ours == theirs


def test_the_compiled_catalogue_is_msgfmts(tmp_path):
    msgfmt = shutil.which("msgfmt")
    if msgfmt is None:
        pytest.skip("msgfmt (GNU gettext) is not installed")
    subprocess.run([msgfmt, "-c", "-o", tmp_path / "labels.mo", i18n.CATALOGUE], check=True)
    with open(tmp_path / "labels.mo", "rb") as theirs:
        expected = gettext.GNUTranslations(theirs)._catalog
    ours = gettext.GNUTranslations(
        io.BytesIO(po.mo_bytes(po.parse(i18n.CATALOGUE.read_text(encoding="utf-8"))))
    )
    assert ours._catalog == expected


def test_the_table_loads_in_a_fresh_process():
    code = "from kvlab.viz import i18n; print(len(i18n.ZH), len(i18n.PATTERNS), len(i18n.KEEP))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(i18n.ZH)), str(len(i18n.PATTERNS)), str(len(i18n.KEEP))]
