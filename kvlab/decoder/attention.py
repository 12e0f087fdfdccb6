"""Attention over a static KV cache, written with plain matmuls so the bytes are explicit.

Decode (one query token per sequence) is where bandwidth matters: every K and V row of
the history is read once. Grouped-query attention is done by viewing the `g` query heads
that share a K/V head as `g` rows of one small matmul, so each K/V head is read once,
not `g` times (SDPA with `enable_gqa` on CPU re-reads it per query head).

Quantized KV (int8, fp8) is dequantized chunk by chunk into a buffer small enough to stay
in cache, so DRAM sees int8 bytes, not a full dequantized copy; the per-(token, head)
scales are applied to the scores and to the probabilities, never to the big K/V tensors.
"""
from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def chunk_tokens(batch: int, kv_heads: int, head_dim: int, budget_bytes: int) -> int:
    """Tokens per dequantization chunk so that one chunk of K (in bf16) is ~budget_bytes."""
    per_token = batch * kv_heads * head_dim * 2
    return max(16, int(budget_bytes // per_token) // 16 * 16)


def decode_attention(q, k, v, k_scale, v_scale, valid, chunk: int):
    """One query token per sequence against n cached tokens.

    q: (B, H, 1, D), already multiplied by 1/sqrt(D), in the compute dtype.
    k, v: (B, KV, n, D) in the storage dtype; k_scale, v_scale: (B, KV, n, 1) fp16 or None.
    valid: (B, 1, 1, n) bool (False = padding of a shorter sequence) or None.
    Returns (B, H, 1, D) in q's dtype.
    """
    B, H, _, D = q.shape
    kv_heads, n = k.shape[1], k.shape[2]
    g = H // kv_heads
    if k_scale is None:
        qg = q.reshape(B, kv_heads, g, D).to(k.dtype)  # (B, KV, g, D): a group's query heads as rows
        scores = torch.matmul(qg, k.transpose(-1, -2))  # (B, KV, g, n)
        if valid is not None:
            scores = scores.masked_fill(~valid, NEG_INF)
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # (B, KV, g, n)
        out = torch.matmul(p, v)  # (B, KV, g, D)
        return out.reshape(B, H, 1, D).to(q.dtype)  # (B, H, 1, D)

    work = q.dtype
    qg = q.reshape(B, kv_heads, g, D)  # (B, KV, g, D)
    scores = torch.empty(B, kv_heads, g, n, dtype=torch.float32, device=q.device)  # (B, KV, g, n)
    if _int8_scores_supported(k, work):
        # CPU: one int8 GEMV per (sequence, head) reads the int8 K rows directly and applies
        # each row's scale (torch's weight-only int8 kernel: K plays the weight matrix)
        row_scales = k_scale[..., 0].to(work)  # (B, KV, n)
        for b in range(B):
            for h in range(kv_heads):
                scores[b, h] = torch._weight_int8pack_mm(qg[b, h], k[b, h], row_scales[b, h])  # (g, n)
    else:
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            kc = k[:, :, c0:c1].to(work)  # (B, KV, c, D) dequantized (scale applied below)
            sc = torch.matmul(qg, kc.transpose(-1, -2))  # (B, KV, g, c)
            scores[..., c0:c1] = sc.float() * k_scale[:, :, c0:c1].transpose(-1, -2).float()  # x (B, KV, 1, c)
    if valid is not None:
        scores.masked_fill_(~valid, NEG_INF)
    p = torch.softmax(scores, dim=-1)  # (B, KV, g, n) fp32
    out = torch.zeros(B, kv_heads, g, D, dtype=torch.float32, device=q.device)  # (B, KV, g, D)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        pc = (p[..., c0:c1] * v_scale[:, :, c0:c1].transpose(-1, -2).float()).to(work)  # (B, KV, g, c)
        out += torch.matmul(pc, v[:, :, c0:c1].to(work)).float()  # (B, KV, g, D)
    return out.reshape(B, H, 1, D).to(q.dtype)  # (B, H, 1, D)


def _int8_scores_supported(k, work) -> bool:
    """torch's CPU weight-only int8 matmul fits q.K^T: int8 rows, a head_dim multiple of 16
    (the kernel crashes otherwise), contiguous rows of each head, bf16/fp32 queries."""
    return (k.device.type == "cpu" and k.dtype == torch.int8 and hasattr(torch, "_weight_int8pack_mm")
            and k.shape[-1] % 16 == 0 and k.stride(-1) == 1 and k.stride(-2) == k.shape[-1]
            and work in (torch.bfloat16, torch.float32))


def dequantize(x, scale, dtype):
    """Storage tensor (..., D) and its (..., 1) scale -> `dtype`; float storage is just cast."""
    if scale is None:
        return x.to(dtype)
    return x.to(dtype) * scale.to(dtype)


def prefill_attention(q, k, v, first_pos, sdpa: bool, budget_bytes: int = 1 << 28):
    """S query tokens per sequence, causal, against n = history + S cached tokens.

    q: (B, H, S, D) scaled by 1/sqrt(D); k, v: (B, KV, n, D) in one float dtype.
    first_pos: (B, 1) long, the position of each sequence's first query token (its history
    length); query i of sequence b sees keys 0..first_pos[b] + i.
    `sdpa`: use PyTorch's fused kernel (flash on CUDA); only valid when every history is 0
    and n == S. Otherwise query chunks keep the score matrix under `budget_bytes`.
    Returns (B, H, S, D) in q's dtype.
    """
    B, H, S, D = q.shape
    kv_heads, n = k.shape[1], k.shape[2]
    g = H // kv_heads
    q = q.to(k.dtype)
    if sdpa:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0, enable_gqa=True)
        return out  # (B, H, S, D)
    out = torch.empty(B, kv_heads, g, S, D, dtype=k.dtype, device=q.device)  # (B, KV, g, S, D)
    qg = q.reshape(B, kv_heads, g, S, D)  # (B, KV, g, S, D)
    rows = max(1, budget_bytes // max(1, B * H * n * 4))
    keys = torch.arange(n, device=q.device)  # (n,)
    for i0 in range(0, S, rows):
        i1 = min(S, i0 + rows)
        c = i1 - i0
        qc = qg[:, :, :, i0:i1].reshape(B, kv_heads, g * c, D)  # (B, KV, g*c, D)
        scores = torch.matmul(qc, k.transpose(-1, -2)).view(B, kv_heads, g, c, n)  # (B, KV, g, c, n)
        limit = first_pos + torch.arange(i0, i1, device=q.device)  # (B, c): last visible key
        visible = keys.view(1, 1, n) <= limit.unsqueeze(-1)  # (B, c, n)
        scores = scores.masked_fill(~visible.view(B, 1, 1, c, n), NEG_INF)
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # (B, KV, g, c, n)
        out[:, :, :, i0:i1] = torch.matmul(p.view(B, kv_heads, g * c, n), v).view(B, kv_heads, g, c, D)
    return out.view(B, H, S, D)  # (B, H, S, D): head h = kv_head * g + j


def softmax_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
