"""The book layer: one module per chapter, named after its notebook.

Each chapter module has `numbers()`, every number (and generated sentence) its prose
states, as {glue key: text} computed by kvlab when the book is built, and functions that
return the chapter's figures and panels (kvlab.viz draws them from data computed here).
A notebook's hidden first cell is `glue_all(chapter.numbers())`; its figure cells call
`show(chapter.<figure>())`. Heavy data (simulations, replays) is computed once per
kernel and shared by the numbers and the figures.

Nothing outside this package knows about chapters; this package imports the domain
(`kvlab.tiers`, `kvlab.sim`, ...) and `kvlab.viz`, and nothing imports it but notebooks
and tests.
"""

from __future__ import annotations

from collections.abc import Mapping


def glue_all(numbers: Mapping[str, str]) -> None:
    """Glue every {key: text} for the prose's {glue:text}`key` roles (not displayed)."""
    from myst_nb import glue

    for key, text in numbers.items():
        glue(key, text, display=False)
