"""Figures for the book: pure functions (data in, bokeh figure out) and two faces per panel.

- static: bokeh widgets + CustomJS that recombine terms kvlab computed at build time, for
  the built book (no kernel). BokehJS is shipped once per site by book/_ext.
- live: ipywidgets controls driving the same figures from the Python ledger, for any
  value, in Jupyter and Voila.

`show(obj)` picks the face: static while the book is being built (KVLAB_BOOK_BUILD=1),
live otherwise. Only this package imports bokeh and ipywidgets.
"""
from .panel import Control, Panel, show

__all__ = ["Control", "Panel", "show"]
