"""Figures for the book: pure functions (data in, bokeh figure out) and two faces per panel.

- static: bokeh widgets whose callback runs the panel's JavaScript twin, a function in
  js/*.js that recombines terms kvlab computed at build time, for the built book (no
  kernel). BokehJS and kvlab's script are shipped once per site by book/_ext; tests/test_js.py
  runs every twin under node against the Python.
- live: ipywidgets controls driving the same figures from the Python ledger, for any
  value, in Jupyter and Voila.

`show(obj)` picks the face: static while the book is being built (KVLAB_BOOK_BUILD=1),
live otherwise. Only this package imports bokeh and ipywidgets.
"""

from .panel import Control, Panel, show

__all__ = ["Control", "Panel", "show"]
