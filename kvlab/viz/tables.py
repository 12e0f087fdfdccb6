"""HTML tables for the book, built from kvlab's catalogues (never typed by hand)."""

from __future__ import annotations

import html

from .. import fmt
from ..cost import kv_bytes_per_token
from ..hardware import devices, tiers
from ..models import describe_params, models


class Table:
    """An HTML table that notebooks display (myst-nb renders text/html)."""

    def __init__(self, header: list[str], rows: list[list[str]], caption: str = ""):
        self.header, self.rows, self.caption = header, rows, caption

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
            for r in self.rows
        )
        cap = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (
            f'<table class="kvlab-table">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )


def device_sources() -> Table:
    rows = [
        [
            d.display_name,
            fmt.si(d.capacity_bytes, "B"),
            fmt.si(d.memory_bandwidth_bytes_per_s, "B/s"),
            fmt.si(d.bf16_flops_per_s, "FLOP/s"),
            fmt.si(d.fp8_flops_per_s, "FLOP/s") if d.fp8_flops_per_s else "n/a",
            d.source,
        ]
        for d in devices().values()
    ]
    return Table(
        ["device", "memory", "bandwidth", "bf16 dense", "fp8 dense", "source"],
        rows,
        "Devices (kvlab/data/hardware.toml)",
    )


def tier_sources() -> Table:
    rows = [
        [t.name, t.kind, fmt.si(t.bandwidth_bytes_per_s, "B/s"), t.derivation, t.source]
        for t in tiers().values()
    ]
    return Table(
        ["tier", "kind", "per direction", "conversion", "source"],
        rows,
        "Memory tiers and links (kvlab/data/hardware.toml)",
    )


def model_sources() -> Table:
    rows = []
    for _name, m in models().items():
        rows.append(
            [
                m.display_name,
                describe_params(m.params.total),
                fmt.si(kv_bytes_per_token(m, "fp16"), "B"),
                m.source,
            ]
        )
    return Table(
        ["model", "parameters (derived)", "KV per token, fp16", "source"],
        rows,
        "Models (kvlab/data/models/*.json, Hugging Face configs)",
    )
