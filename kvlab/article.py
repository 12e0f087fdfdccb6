"""Figures the source article quotes, kept as the article states them.

The book sets kvlab's own numbers beside these; nothing else in kvlab uses them as facts
about hardware (the catalogue in kvlab/data/hardware.toml does that, with sources).
"""

from __future__ import annotations

#: "At 2 TB/s ...": the article's round figure for a data-centre GPU's memory bandwidth.
ARTICLE_BANDWIDTH_BYTES_PER_S = 2e12
#: The article writes "200 GB/s" for an InfiniBand link; one 200 Gb/s NIC is 25 GB/s.
#: The book shows both (200 GB/s = 1.6 Tb/s: eight such NICs, not one).
ARTICLE_IB_BYTES_PER_S = 200e9
#: The article's worked example: a 7B model (kvlab's "article-7b": Llama-style, GQA with
#: 8 KV heads) at a 4K context.
ARTICLE_MODEL = "article-7b"
ARTICLE_CONTEXT_TOKENS = 4096
