"""The language of the sentences the chapters generate (glued into the prose).

The book is built once per edition; the Chinese build sets KVLAB_BOOK_LANG=zh_CN, and a
chapter module that writes a sentence in Python writes it in that language:

    from .lang import join, pick
    pick(f"On {device} the curves cross at {n} tokens",
         f"在 {device} 上，两条曲线在 {n} 个 token 处相交")
    join(["A", "B", "C"])   # 'A, B and C'  /  'A、B 和 C'

Numbers are formatted once, by kvlab.fmt, before either wording takes them, so both
editions show the same figures. Labels of figures and panels go through kvlab.viz.i18n.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..viz.i18n import CHINESE, chinese, language

__all__ = ["CHINESE", "chinese", "clauses", "join", "language", "pick", "sentences"]


def pick(english: str, chinese_text: str) -> str:
    """The wording for the edition being built."""
    return chinese_text if chinese() else english


def join(items: Iterable[str], last: str = "and") -> str:
    """'A', 'A and B', 'A, B and C'; in Chinese 'A', 'A 和 B', 'A、B 和 C' (last: 'and'
    or 'or': 或)."""
    items = [str(i) for i in items]
    if len(items) <= 1:
        return "".join(items)
    if chinese():
        word = {"and": "和", "or": "或"}[last]
        return "、".join(items[:-1]) + f" {word} " + items[-1]
    return ", ".join(items[:-1]) + f" {last} " + items[-1]


def sentences(parts: Iterable[str]) -> str:
    """Sentences (each already ending in its full stop) run together: a space between
    English sentences, none between Chinese ones."""
    return ("" if chinese() else " ").join(p for p in parts if p)


def clauses(parts: Iterable[str]) -> str:
    """Clauses joined by semicolons: '; ' in English, '；' in Chinese."""
    return ("；" if chinese() else "; ").join(p for p in parts if p)
