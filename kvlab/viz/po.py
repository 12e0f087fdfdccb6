"""Read a gettext `.po` catalogue into Python's `gettext`, with the standard library only.

Why not babel or msgfmt: kvlab needs only numpy at run time, and the Chinese labels
(kvlab/viz/locale/zh_CN/LC_MESSAGES/kvlab-labels.po) must load wherever the package is
installed. The `.po` is compiled to `.mo` bytes in memory (no build step, nothing written)
and opened with `gettext.GNUTranslations`, so lookups follow gettext's rules.

`parse` keeps the file's order (kvlab's templates are tried first match first; a `.mo`
sorts its keys) and handles what kvlab's catalogues use: comments, `msgctxt`, `msgid`,
`msgstr`, continued strings, C escapes, and the `fuzzy` flag. Plural forms are refused.
"""

from __future__ import annotations

import gettext
import io
import re
import struct
from dataclasses import dataclass
from pathlib import Path

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}  # fmt: skip
_KEYWORD = re.compile(r'^(msgctxt|msgid|msgstr)\s+(".*")\s*$')
_CONTINUATION = re.compile(r'^(".*")\s*$')
#: gettext's separator between a message's context and its id in a `.mo` key.
CONTEXT_SEPARATOR = "\x04"


@dataclass(frozen=True)
class Entry:
    context: str | None
    msgid: str
    msgstr: str
    fuzzy: bool = False


def _unquote(quoted: str, where: str) -> str:
    """'"a\\"b"' -> 'a"b' (PO strings use C's escapes)."""
    body = quoted[1:-1]

    def one(match):
        if match.group(1) not in _ESCAPES:
            raise ValueError(f"{where}: unknown escape \\{match.group(1)}")
        return _ESCAPES[match.group(1)]

    if re.search(r'(?<!\\)(?:\\\\)*"', body):
        raise ValueError(f"{where}: unescaped quote in {quoted}")
    return re.sub(r"\\(.)", one, body)


def parse(text: str, name: str = "<po>") -> list[Entry]:
    """The entries of a `.po` text, header (msgid "") included, in file order."""
    entries: list[Entry] = []
    fields: dict[str, str] = {}
    current = None  # the keyword that continued strings extend
    fuzzy = False

    def finish():
        nonlocal fields, fuzzy, current
        if fields:
            if "msgid" not in fields or "msgstr" not in fields:
                raise ValueError(f"{name}: an entry without msgid or msgstr: {fields}")
            entries.append(Entry(fields.get("msgctxt"), fields["msgid"], fields["msgstr"], fuzzy))
        fields, fuzzy, current = {}, False, None

    for number, raw in enumerate(text.splitlines(), 1):
        line, where = raw.strip(), f"{name}:{number}"
        if not line:
            continue
        if line.startswith("#"):
            if fields.get("msgstr") is not None:  # a comment starts the next entry
                finish()
            if line.startswith("#,") and "fuzzy" in line[2:].replace(",", " ").split():
                fuzzy = True
            continue
        keyword = _KEYWORD.match(line)
        if keyword:
            word, quoted = keyword.groups()
            if word in fields or (word != "msgstr" and "msgstr" in fields):
                finish()
            fields[word], current = _unquote(quoted, where), word
            continue
        continued = _CONTINUATION.match(line)
        if continued and current:
            fields[current] += _unquote(continued.group(1), where)
            continue
        raise ValueError(f"{where}: not understood (plural forms are not supported): {raw}")
    finish()
    return entries


def mo_bytes(entries: list[Entry]) -> bytes:
    """A GNU `.mo` file of the translated entries (as msgfmt: fuzzy and empty ones left out)."""
    pairs = {}
    for entry in entries:
        if entry.fuzzy or (entry.msgid and not entry.msgstr):
            continue
        key = entry.msgid
        if entry.context is not None:
            key = entry.context + CONTEXT_SEPARATOR + entry.msgid
        pairs[key.encode()] = entry.msgstr.encode()
    keys = sorted(pairs)
    values = [pairs[k] for k in keys]
    first = 7 * 4 + 2 * 8 * len(keys)  # after the header and the two (length, offset) tables
    table = []
    for strings in (keys, values):
        for string in strings:
            table += [len(string), first]
            first += len(string) + 1
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    return (
        header + struct.pack(f"<{len(table)}I", *table) + b"".join(s + b"\0" for s in keys + values)
    )


def load(path: Path) -> tuple[list[Entry], gettext.GNUTranslations]:
    """The catalogue's translated entries (file order, header left out) and its translations."""
    entries = parse(Path(path).read_text(encoding="utf-8"), str(path))
    translations = gettext.GNUTranslations(io.BytesIO(mo_bytes(entries)))
    return [e for e in entries if e.msgid and e.msgstr and not e.fuzzy], translations
