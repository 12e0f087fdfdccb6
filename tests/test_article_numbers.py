"""The source article's worked numbers, reproduced exactly by the ledger."""

import pytest

from kvlab import cost
from kvlab.deployment import Deployment

GiB = 2**30
ARTICLE = Deployment("article-7b", "h100-sxm")
AT_2_TB_PER_S = ARTICLE.replace(bandwidth_bytes_per_s=2e12)  # the article's round device


def test_fp16_weights_of_7b_are_14_gb():
    assert cost.weight_bytes("article-7b", "fp16") == 14e9


def test_ceiling_at_2_tb_per_s_is_about_143_tokens_per_s():
    # 2e12 / 14e9 = 142.857...: the "about 140 tokens/s" of section 1.1
    step = cost.decode_step(AT_2_TB_PER_S, batch=1, context=0)
    # 14e9 to the last bit but one: the operator table sums the weights operator by operator
    assert step.weight_read_bytes == pytest.approx(14e9, rel=1e-15)
    assert step.kv_read_bytes == 0
    assert 2e12 / step.weight_read_bytes == pytest.approx(142.857, abs=1e-3)
    # the only other bytes at context 0 are the new token's K/V (131,072 B)
    assert step.tokens_per_s == pytest.approx(2e12 / (14e9 + 131072))


def test_kv_per_token_is_128_kib():
    # 2 x 32 layers x 8 KV heads x 128 head_dim x 2 bytes
    assert cost.kv_bytes_per_token("article-7b", "fp16") == 2 * 32 * 8 * 128 * 2 == 131072


def test_one_4k_request_holds_512_mib_of_kv():
    step = cost.decode_step(ARTICLE, batch=1, context=4096)
    assert step.kv_read_bytes == 536_870_912
    assert step.kv_cache_bytes == 536_870_912


def test_32_requests_at_4k_hold_16_gib():
    step = cost.decode_step(ARTICLE, batch=32, context=4096)
    assert step.kv_cache_bytes == 16 * GiB


def test_14_5_gb_step_at_2_tb_per_s_gives_137_6_tokens_per_s():
    step = cost.decode_step(AT_2_TB_PER_S, batch=1, context=4096)
    assert step.step_bytes == pytest.approx(14.537e9, rel=1e-4)
    assert round(step.tokens_per_s, 1) == 137.6
    assert step.bound == "memory"
