"""Attention over the block-major KV cache, written with plain matmuls so the bytes are explicit.

Decode (one query token per sequence) is where bandwidth matters: every K and V row of
the history is read once. Grouped-query attention is done by viewing the `g` query heads
that share a K/V head as `g` rows of one small matmul, so each K/V head is read once,
not `g` times (SDPA with `enable_gqa` on CPU re-reads it per query head). The cache's
blocks form the batch of that matmul, so V is reduced block by block (a split-K that
keeps a GPU busy even at batch 1) and the partial sums are added at the end.

Quantized KV (int8, fp8) is dequantized a few blocks at a time into a buffer small
enough to stay in cache, so DRAM sees int8 bytes, not a full dequantized copy; the
per-(token, head) scales are applied to the scores and to the probabilities, never to
the big K/V tensors.
"""

from __future__ import annotations

import math
import re

import torch

NEG_INF = float("-inf")


def chunk_blocks(block_bytes: int, budget_bytes: int) -> int:
    """Blocks per dequantization chunk so that one chunk (in the compute dtype) fits the budget."""
    return max(1, int(budget_bytes // max(1, block_bytes)))


def decode_attention(q, k, v, k_scale, v_scale, valid, chunk_budget_bytes: int):
    """One query token per sequence against nb blocks of cached tokens.

    q: (B, H, 1, D), already multiplied by 1/sqrt(D), in the compute dtype.
    k, v: (nb, B, KV, blk, D) in the storage dtype; k_scale, v_scale: (nb, B, KV, blk, 1)
    fp16 or None. valid: (B, 1, 1, nb*blk) bool, False for positions to ignore (past a
    sequence's length), or None when every position is valid.
    Returns (B, H, 1, D) in q's dtype.
    """
    B, H, _, D = q.shape
    nb, _, kv_heads, blk, _ = k.shape
    g = H // kv_heads
    n = nb * blk
    work = k.dtype if k_scale is None else q.dtype
    qg = q.reshape(1, B, kv_heads, g, D).to(work)  # (1, B, KV, g, D): a group's query heads as rows
    if k_scale is None:
        scores = torch.matmul(qg, k.transpose(-1, -2))  # (nb, B, KV, g, blk)
    else:
        step = chunk_blocks(B * kv_heads * blk * D * q.element_size(), chunk_budget_bytes)
        scores = torch.empty(nb, B, kv_heads, g, blk, dtype=torch.float32, device=q.device)
        for c0 in range(0, nb, step):
            kc = k[c0 : c0 + step].to(work)  # (c, B, KV, blk, D) dequantized, cache-resident
            sc = torch.matmul(qg, kc.transpose(-1, -2))  # (c, B, KV, g, blk)
            # x (c, B, KV, 1, blk)
            scores[c0 : c0 + step] = sc.float() * k_scale[c0 : c0 + step].transpose(-1, -2).float()
    # (B, KV, g, n): position j*blk + i
    scores = scores.permute(1, 2, 3, 0, 4).reshape(B, kv_heads, g, n)
    if valid is not None:
        scores = scores.masked_fill(~valid, NEG_INF)
    p = torch.softmax(scores, dim=-1, dtype=torch.float32)  # (B, KV, g, n)
    p = p.view(B, kv_heads, g, nb, blk).permute(3, 0, 1, 2, 4)  # (nb, B, KV, g, blk)
    if v_scale is None:
        partial = torch.matmul(p.to(v.dtype), v)  # (nb, B, KV, g, D): one block's share each
        out = partial.sum(dim=0, dtype=torch.float32)  # (B, KV, g, D)
    else:
        step = chunk_blocks(B * kv_heads * blk * D * q.element_size(), chunk_budget_bytes)
        out = torch.zeros(B, kv_heads, g, D, dtype=torch.float32, device=q.device)  # (B, KV, g, D)
        for c0 in range(0, nb, step):
            # (c, B, KV, g, blk)
            pc = (p[c0 : c0 + step] * v_scale[c0 : c0 + step].transpose(-1, -2).float()).to(work)
            vc = v[c0 : c0 + step].to(work)  # (c, B, KV, blk, D)
            out += torch.matmul(pc, vc).sum(dim=0, dtype=torch.float32)  # (B, KV, g, D)
    return out.reshape(B, H, 1, D).to(q.dtype)  # (B, H, 1, D): head h = kv_head * g + j


def gather(x, scale, dtype):
    """Blocks (nb, B, KV, blk, D) (+ scales) -> one (B, KV, nb*blk, D) tensor in `dtype`."""
    nb, B, kv_heads, blk, D = x.shape
    y = x.to(dtype) if scale is None else x.to(dtype) * scale.to(dtype)
    return y.permute(1, 2, 0, 3, 4).reshape(B, kv_heads, nb * blk, D)  # (B, KV, n, D)


def prefill_attention(q, k, v, first_pos, sdpa: bool, budget_bytes: int = 1 << 28):
    """S query tokens per sequence, causal, against n cached positions (history + S, maybe padded).

    q: (B, H, S, D) scaled by 1/sqrt(D); k, v: (B, KV, n, D) in one float dtype.
    first_pos: (B, 1) long, the position of each sequence's first query token (its history
    length); query i of sequence b sees keys 0..first_pos[b] + i.
    `sdpa`: PyTorch's fused kernel (flash on CUDA), valid when every history is 0; k, v
    are then cut to the S positions. Otherwise query chunks keep the score matrix under
    `budget_bytes`. Returns (B, H, S, D) in k's dtype.
    """
    B, H, S, D = q.shape
    kv_heads, n = k.shape[1], k.shape[2]
    g = H // kv_heads
    q = q.to(k.dtype)
    if sdpa:
        return sdpa_causal(q, k[:, :, :S], v[:, :, :S])  # (B, H, S, D)
    out = torch.empty(B, kv_heads, g, S, D, dtype=k.dtype, device=q.device)  # (B, KV, g, S, D)
    qg = q.reshape(B, kv_heads, g, S, D)  # (B, KV, g, S, D)
    rows = max(1, budget_bytes // max(1, B * H * n * 4))
    keys = torch.arange(n, device=q.device)  # (n,)
    for i0 in range(0, S, rows):
        i1 = min(S, i0 + rows)
        c = i1 - i0
        qc = qg[:, :, :, i0:i1].reshape(B, kv_heads, g * c, D)  # (B, KV, g*c, D)
        # (B, KV, g, c, n)
        scores = torch.matmul(qc, k.transpose(-1, -2)).view(B, kv_heads, g, c, n)
        limit = first_pos + torch.arange(i0, i1, device=q.device)  # (B, c): last visible key
        visible = keys.view(1, 1, n) <= limit.unsqueeze(-1)  # (B, c, n)
        scores = scores.masked_fill(~visible.view(B, 1, 1, c, n), NEG_INF)
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # (B, KV, g, c, n)
        out[:, :, :, i0:i1] = torch.matmul(p.view(B, kv_heads, g * c, n), v).view(
            B, kv_heads, g, c, D
        )
    return out.view(B, H, S, D)  # (B, H, S, D): head h = kv_head * g + j


def _torch_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


#: `scaled_dot_product_attention(..., enable_gqa=True)` arrived in torch 2.5; kvlab
#: promises torch >= 2.3, where K and V are expanded to every query head instead.
SDPA_GQA = _torch_at_least(2, 5)


def sdpa_causal(q, k, v):
    """Causal SDPA with q already scaled: q (B, H, S, D), k, v (B, KV, S, D); query head h
    reads K/V head h // (H / KV). Returns (B, H, S, D)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return sdpa(q, k, v, is_causal=True, scale=1.0)
    if SDPA_GQA:
        return sdpa(q, k, v, is_causal=True, scale=1.0, enable_gqa=True)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
    return sdpa(q, k, v, is_causal=True, scale=1.0)


def softmax_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
