"""Chapter 1, "What a cache hit saves": compute, not the bytes a decode step moves."""

from __future__ import annotations

import functools

from .. import cost, fmt
from ..article import ARTICLE_BANDWIDTH_BYTES_PER_S, ARTICLE_MODEL
from ..deployment import Deployment
from ..models import describe_params, get_model
from .lang import pick


def _article() -> cost.DecodeStep:
    """The article's 7B at batch 1 with no history, on its round 2 TB/s device."""
    d = Deployment(ARTICLE_MODEL, "h100-sxm", bandwidth_bytes_per_s=ARTICLE_BANDWIDTH_BYTES_PER_S)
    return cost.decode_step(d, 1, 0)


@functools.cache
def hit_panel():
    from ..viz import what_a_hit_saves as figures  # noqa: PLC0415 - bokeh loads only when a figure is drawn

    return figures.hit_panel()


def numbers() -> dict[str, str]:
    article = _article()
    bw = ARTICLE_BANDWIDTH_BYTES_PER_S
    panel = hit_panel()
    default, no_hit = panel.values(), panel.values(hit=0.0)
    return {
        "weights": fmt.si(article.weight_bytes, "B"),
        "bandwidth": fmt.si(bw, "B/s"),
        "weights_time": fmt.seconds(article.weight_bytes / bw),
        "ceiling": fmt.rate(bw / article.weight_bytes),
        "params": describe_params(get_model(ARTICLE_MODEL).params.total),
        "kv_per_token": fmt.si(article.kv_bytes_per_token, "B"),
        "kv_per_token_kib": fmt.sig(article.kv_bytes_per_token / 1024, 3),  # the article's "KB"
        **panel.readout_texts(),
        **panel.readout_texts("nohit", hit=0.0),
        "hits_default_hit": fmt.percent(panel.default_state["hit"]),
        "hits_prompt": fmt.fixed(panel.default_state["context"], 0),
        "hits_ttft_ratio": fmt.sig(default["ttft_miss_s"] / default["ttft_s"], 3),
        "hits_tpot_change": fmt.percent(abs(no_hit["step_time_s"] / default["step_time_s"] - 1)),
    }


def worked_example() -> str:
    """The chapter's checked printout (nbval compares it): weights, ceiling, KV per token."""
    article, bw = _article(), ARTICLE_BANDWIDTH_BYTES_PER_S
    weights = f"{article.weight_bytes:.3e}"
    ceiling = f"{bw:.0e} B/s"
    tokens_per_s = f"{bw / article.weight_bytes:.1f} tokens/s"
    kv = f"{article.kv_bytes_per_token:,.0f}"
    return "\n".join(
        [
            pick(
                f"weights of the article's 7B in fp16: {weights} bytes",
                f"原文 7B 模型的 fp16 权重：{weights} 字节",
            ),
            pick(
                f"ceiling at {ceiling}, batch 1: {tokens_per_s}",
                f"带宽 {ceiling}、批大小 1 时的上限：{tokens_per_s}",
            ),
            pick(f"KV cache per token: {kv} bytes", f"每个 token 的 KV cache：{kv} 字节"),
        ]
    )
