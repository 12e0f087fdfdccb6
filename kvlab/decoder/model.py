"""The toy Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, an untied
LM head, random weights (the bytes, not the words, are what it is for).

Every forward pass is planned first (`Decoder.plan`): positions, masks and write indices
become device tensors before any kernel runs, so a planned decode step has no host
round trip and can be captured in a CUDA graph. `prefill` and `decode` are the two
usual entry points; benchmarks call `forward_plan` with one plan over and over.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import native
from ..errors import KvlabError
from . import fit
from .attention import decode_attention, gather, prefill_attention, softmax_scale
from .config import WEIGHT_DTYPES, DecoderConfig, check_choice, get_config
from .kvcache import KVCache, torch_dtype

FLOAT_DTYPES = ("fp32", "bf16", "fp16")
KERNELS = ("auto", "native", "torch")


@dataclass
class StepPlan:
    """Where one forward pass reads and writes: S new tokens after `hist[b]` cached ones."""

    hist: list[int]  # history length of each sequence before this pass
    new_tokens: int  # S
    n_total: int  # positions attended: max(hist) + S
    positions: torch.Tensor  # (B, S) long: RoPE positions of the new tokens
    first_pos: torch.Tensor  # (B, 1) long: position of each sequence's first new token
    valid: torch.Tensor | None  # (B, 1, 1, nb*blk) bool for decode; None when all positions count
    block_index: torch.Tensor  # (B, S) long: cache block of each new token
    block_offset: torch.Tensor  # (B, S) long: its place in the block
    batch_rows: torch.Tensor  # (B, S) long: its sequence
    touched_blocks: tuple[int, int]  # [first, last + 1) blocks the new tokens land in
    sdpa: bool  # prefill through the fused kernel
    kv_lengths: torch.Tensor  # (B,) long: positions each sequence attends (history + S)


def _int8_matmul_supported(device: torch.device, in_features: int, dtype: torch.dtype) -> bool:
    """Whether torch's fused weight-only int8 matmul can run this shape.

    On CPU `_weight_int8pack_mm` reads int8 weights straight from memory (1 byte per
    weight moved); it crashes on inner dimensions that are not a multiple of 16, so those
    use the dequantize-then-matmul fallback. Other devices: probed once.
    """
    if not hasattr(torch, "_weight_int8pack_mm") or in_features % 16:
        return False
    if device.type == "cpu":
        return dtype in (torch.float32, torch.bfloat16)
    key = (str(device), dtype)
    if key not in _INT8_PROBED:
        try:
            w = torch.zeros(32, 32, dtype=torch.int8, device=device)
            torch._weight_int8pack_mm(torch.zeros(2, 32, dtype=dtype, device=device), w,
                                      torch.ones(32, dtype=dtype, device=device))
            _INT8_PROBED[key] = True
        except (RuntimeError, NotImplementedError):
            _INT8_PROBED[key] = False
    return _INT8_PROBED[key]


_INT8_PROBED: dict = {}


def _prepack_supported() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _onednn_layout(weight):
    """A bf16 CPU weight (out, in) reordered into oneDNN's blocked layout (an opaque mkldnn
    tensor), checked bit for bit against F.linear on a probe; None where that is unavailable."""
    if not _prepack_supported():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        ok = torch.equal(torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], ""),
                         F.linear(probe, weight))
    except RuntimeError:
        return None
    return packed if ok else None


class Linear(torch.nn.Module):
    """y = x W^T with W (out, in) in fp32/bf16/fp16, or int8 with one scale per output row."""

    def __init__(self, in_features, out_features, weight_dtype, compute_dtype, device, generator):
        super().__init__()
        w = torch.randn(out_features, in_features, generator=generator, device=device) * in_features ** -0.5
        self.int8 = weight_dtype == "int8"
        self.packed = False
        if self.int8:
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # (out,)
            self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
            self.register_buffer("scale", scale.to(compute_dtype))  # (out,)
            self.fused = _int8_matmul_supported(torch.device(device), in_features, compute_dtype)
        else:
            self.register_buffer("weight", w.to(torch_dtype(weight_dtype)))
        self.in_features, self.out_features = in_features, out_features
        self.native = False  # weight packed for kvlab.native.gemv_bf16 (see use_native)
        self._gemm_weight = None  # native: the prefill copy in oneDNN's layout, built on first use
        self.nbytes = sum(t.numel() * t.element_size() for t in self.buffers())  # what one pass streams

    def prepack(self) -> bool:
        """CPU, bf16: hand oneDNN its weights in its own blocked layout, once.

        A plain bf16 `F.linear` on CPU re-lays the weight out for oneDNN on every call, so a
        one-token step streams the weights at ~70% of the copy bandwidth; prepacked (what
        inductor does when it freezes a model) it streams at about the copy bandwidth. Same
        numbers, bit for bit. Replaces `weight` by an opaque mkldnn tensor.
        """
        if self.packed or self.native or self.int8 or self.weight.device.type != "cpu" \
                or self.weight.dtype != torch.bfloat16:
            return self.packed
        packed = _onednn_layout(self.weight)
        if packed is not None:
            self.weight, self.packed = packed, True
        return self.packed

    def use_native(self) -> bool:
        """CPU, bf16: re-lay the weight out for kvlab's matrix-vector kernel, once. Decode rows
        then stream it at memory speed; prefill (compute-bound) uses a second copy in oneDNN's
        layout, built on its first call and kept. Same numbers up to fp32 summation order."""
        if self.native or self.packed or self.int8 or not native.gemv_supported(self.weight):
            return self.native
        self.weight, self.native = native.pack_weight(self.weight), True
        return True

    def forward(self, x):
        if self.native:
            if x.numel() // self.in_features <= native.MAX_GEMV_ROWS:
                return native.gemv_bf16(x, self.weight, self.out_features)
            return self._native_gemm(x)
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.weight, None, "none", [], "")
        if not self.int8:
            return F.linear(x.to(self.weight.dtype), self.weight)
        if self.fused:
            flat = x.reshape(-1, self.in_features).contiguous()  # (tokens, in)
            return torch._weight_int8pack_mm(flat, self.weight, self.scale).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight.to(x.dtype)) * self.scale  # moves more than 1 byte/weight


    def _native_gemm(self, x):
        """Native weights, many rows (prefill, compute-bound): oneDNN's GEMM on a second copy of
        the weight in oneDNN's layout (plain where that is unavailable), built on first use."""
        if self._gemm_weight is None:
            plain = native.unpack_weight(self.weight, self.out_features).contiguous()
            packed = _onednn_layout(plain)
            self._gemm_weight = (plain, False) if packed is None else (packed, True)
        w, onednn = self._gemm_weight
        if onednn:
            return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), w, None, "none", [], "")
        return F.linear(x.to(torch.bfloat16), w)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps, dtype, device):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, c: DecoderConfig, weight_dtype, compute_dtype, device, g):
        super().__init__()
        qkv_out = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        self.attention_norm = RMSNorm(c.hidden_size, c.norm_eps, compute_dtype, device)
        self.wqkv = Linear(c.hidden_size, qkv_out, weight_dtype, compute_dtype, device, g)  # fused q, k, v
        self.wo = Linear(c.num_heads * c.head_dim, c.hidden_size, weight_dtype, compute_dtype, device, g)
        self.ffn_norm = RMSNorm(c.hidden_size, c.norm_eps, compute_dtype, device)
        self.w13 = Linear(c.hidden_size, 2 * c.intermediate_size, weight_dtype, compute_dtype, device, g)  # gate | up
        self.w2 = Linear(c.intermediate_size, c.hidden_size, weight_dtype, compute_dtype, device, g)


def apply_rope(x, rot):
    """x (B, S, heads, D), rot (B, S, 1, D/2) complex (cos + i sin): rotate consecutive pairs
    (Meta's layout) as one complex multiply, a quarter of the ops of the real-valued form."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, S, heads, D/2)
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)  # (B, S, heads, D)


class Decoder(torch.nn.Module):
    """A Llama-style decoder with random weights; KV lives in a `KVCache` passed to each call."""

    def __init__(self, config: DecoderConfig | str = "tiny", weight_dtype: str = "fp32", device="cpu",
                 compute_dtype: str | None = None, seed: int = 0, prefill_kernel: str = "auto", prepack: bool = True,
                 kernels: str = "auto"):
        """`kernels`: decode kernels on CPU. "native" = kvlab's C kernels (bf16 weights and KV
        streamed at memory speed), "torch" = PyTorch's, "auto" = native where it builds."""
        super().__init__()
        c = self.config = get_config(config)
        self.weight_dtype = check_choice("weight dtype", weight_dtype, WEIGHT_DTYPES)
        self.compute_dtype_name = compute_dtype or (self.weight_dtype if self.weight_dtype in FLOAT_DTYPES else "bf16")
        check_choice("compute dtype", self.compute_dtype_name, FLOAT_DTYPES)
        self.compute_dtype = torch_dtype(self.compute_dtype_name)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise KvlabError("device 'cuda' asked for, but torch sees no CUDA device")
        self.prefill_kernel = check_choice("prefill kernel", prefill_kernel, ("auto", "sdpa", "matmul"))
        self.kernels, self.kernels_note = self._pick_kernels(check_choice("kernels", kernels, KERNELS))
        self._check_memory()
        g = torch.Generator(device=self.device).manual_seed(seed)
        self.tok_embeddings = torch.nn.Parameter(
            torch.randn(c.vocab_size, c.hidden_size, generator=g, device=self.device).to(self.compute_dtype),
            requires_grad=False)  # gathered, not streamed
        self.layers = torch.nn.ModuleList(
            Block(c, self.weight_dtype, self.compute_dtype, self.device, g) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.norm_eps, self.compute_dtype, self.device)
        self.output = Linear(c.hidden_size, c.vocab_size, self.weight_dtype, self.compute_dtype, self.device, g)
        self._rope = torch.empty(0, dtype=torch.complex64)
        self.requires_grad_(False)
        if self.kernels == "native":
            for m in self.modules():
                if isinstance(m, Linear):
                    m.use_native()
        self.prepacked = self.prepack() if prepack else 0

    def decode_kernels(self, kv_dtype: str) -> dict:
        """Which kernels a decode step runs: {"weights": ..., "attention": ...}, each
        "native" or "torch" (native attention takes bf16 or int8 KV with head_dim % 64 == 0)."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        weights = "native" if linears and all(m.native for m in linears) else \
            "mixed" if any(m.native for m in linears) else "torch"
        attention = "native" if (self.kernels == "native" and kv_dtype in ("bf16", "int8")
                                 and self.config.head_dim % 64 == 0
                                 and self.config.head_dim <= native.MAX_HEAD_DIM) else "torch"
        return {"weights": weights, "attention": attention}

    def _pick_kernels(self, asked: str) -> tuple[str, str]:
        """("native" | "torch", one line saying why)."""
        if self.device.type != "cpu":
            if asked == "native":
                raise KvlabError(f"kernels 'native' are CPU kernels; on {self.device.type} use 'torch' or 'auto'")
            return "torch", f"PyTorch kernels on {self.device.type}"
        if asked == "torch":
            return "torch", "PyTorch kernels (asked for)"
        if native.available():
            return "native", native.status()
        if asked == "native":
            raise KvlabError(f"kernels 'native' asked for, but they are unavailable here: {native.status()}")
        return "torch", native.status()

    def _check_memory(self) -> None:
        from .ledger import model_spec, weight_ledger_dtype
        from ..cost import weight_bytes

        needed = weight_bytes(model_spec(self.config), weight_ledger_dtype(self.config, self.weight_dtype))
        fit.require(f"decoder '{self.config.name}' weights ({self.weight_dtype})", needed, self.device,
                    "pick a smaller preset or int8 weights")

    # ------------------------------------------------------------ sizes
    def streamed_weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads: everything but the embedding table."""
        linears = sum(m.nbytes for m in self.modules() if isinstance(m, Linear))
        norms = sum(m.weight.numel() * m.weight.element_size() for m in self.modules() if isinstance(m, RMSNorm))
        return linears + norms

    def prepack(self) -> int:
        """Prepack bf16 weights for oneDNN on CPU (see `Linear.prepack`); returns how many were."""
        return sum(m.prepack() for m in self.modules() if isinstance(m, Linear) and not m.native)

    def new_cache(self, batch: int, max_seq_len: int, kv_dtype: str = "bf16", placement: str = "device",
                  prefetch: bool = False, **kwargs) -> KVCache:
        """A KV cache for this model on its device (kwargs: block_tokens, chunk_budget_bytes)."""
        return KVCache(self.config, batch, max_seq_len, kv_dtype, placement, self.device, prefetch, **kwargs)

    # ------------------------------------------------------------ planning
    def _rope_tables(self, n: int):
        """(T, D/2) complex64 rotations cos + i sin for positions 0..T-1, T >= n."""
        if self._rope.shape[0] < n:
            size = max(n, 2 * self._rope.shape[0], 256)
            d = self.config.head_dim
            inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))
            angles = torch.outer(torch.arange(size, device=self.device, dtype=torch.float32), inv)  # (T, D/2)
            self._rope = torch.polar(torch.ones_like(angles), angles)
        return self._rope

    def plan(self, cache: KVCache, hist: list[int], new_tokens: int) -> StepPlan:
        """Index tensors for `new_tokens` per sequence after `hist[b]` cached ones."""
        B = cache.batch
        if len(hist) != B:
            raise KvlabError(f"need one history length per sequence ({B}), got {len(hist)}")
        if new_tokens < 1 or max(hist) + new_tokens > cache.max_seq_len:
            raise KvlabError(f"{max(hist)} cached + {new_tokens} new tokens exceed the cache's "
                             f"max_seq_len {cache.max_seq_len}; allocate a longer cache")
        if len(set(hist)) > 1 and new_tokens != 1:
            raise KvlabError("sequences with different cached lengths can only decode one token at a time")
        n_total = max(hist) + new_tokens
        self._rope_tables(n_total)
        dev, blk = self.device, cache.block_tokens
        first = torch.tensor(hist, dtype=torch.long, device=dev).view(B, 1)  # (B, 1)
        positions = first + torch.arange(new_tokens, device=dev).view(1, -1)  # (B, S)
        span = cache.blocks(n_total) * blk
        valid = None
        if new_tokens == 1 and (len(set(hist)) > 1 or n_total < span):
            valid = (torch.arange(span, device=dev).view(1, -1) <= first).view(B, 1, 1, span)  # (B, 1, 1, nb*blk)
        sdpa = new_tokens > 1 and max(hist) == 0 and (
            self.prefill_kernel == "sdpa" or (self.prefill_kernel == "auto" and dev.type == "cuda"))
        touched = (min(hist) // blk, (n_total - 1) // blk + 1)
        return StepPlan(list(hist), new_tokens, n_total, positions, first, valid, positions // blk,
                        positions % blk, torch.arange(B, device=dev).view(B, 1).expand(B, new_tokens),
                        touched, sdpa, (first + new_tokens).view(B))

    # ------------------------------------------------------------ forward
    def forward_plan(self, tokens: torch.Tensor, cache: KVCache, plan: StepPlan) -> torch.Tensor:
        """tokens (B, S) -> logits (B, S, vocab) in fp32; writes the new K/V into `cache`."""
        c = self.config
        B, S = tokens.shape
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        rot_k = self._rope[plan.positions].unsqueeze(2)  # (B, S, 1, D/2) complex
        rot_q = rot_k * softmax_scale(D)  # the query's 1/sqrt(D) rides on its rotation
        x = self.tok_embeddings[tokens]  # (B, S, hidden)
        cache.begin(max(plan.hist))
        for i, layer in enumerate(self.layers):
            h = layer.attention_norm(x)
            qkv = layer.wqkv(h)  # (B, S, (H + 2KV) * D)
            q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            q = apply_rope(q.view(B, S, H, D), rot_q)  # (B, S, H, D), scaled by 1/sqrt(D)
            k = apply_rope(k.view(B, S, KV, D), rot_k)  # (B, S, KV, D)
            q = q.transpose(1, 2).to(self.compute_dtype)  # (B, H, S, D)
            k, v = k.transpose(1, 2), v.reshape(B, S, KV, D).transpose(1, 2)  # (B, KV, S, D)
            cache.layer_ready(i)
            cache.write(i, k, v, plan)
            kk, vv, ks, vs = cache.view(i, plan.n_total)  # (nb, B, KV, blk, D), scales (..., 1)
            if S == 1 and self.kernels == "native" and native.attention_supported(kk, ks, D):
                y = native.decode_attention(q, kk, vv, plan.kv_lengths, ks, vs)  # (B, H, 1, D)
            elif S == 1:
                y = decode_attention(q, kk, vv, ks, vs, plan.valid, cache.chunk_budget_bytes)  # (B, H, 1, D)
            else:
                work = kk.dtype if ks is None else self.compute_dtype
                y = prefill_attention(q, gather(kk, ks, work), gather(vv, vs, work), plan.first_pos, plan.sdpa)
            cache.layer_done(i)
            y = y.to(self.compute_dtype).transpose(1, 2).reshape(B, S, H * D)  # (B, S, H*D)
            x = x + layer.wo(y)
            gate, up = layer.w13(layer.ffn_norm(x)).chunk(2, dim=-1)  # (B, S, I) each
            x = x + layer.w2(F.silu(gate) * up)
        return self.output(self.norm(x)).float()  # (B, S, vocab)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: KVCache, lengths: list[int] | None = None) -> torch.Tensor:
        """Append a prompt to every sequence: tokens (B, S), right-padded when `lengths`
        (each <= S) differ. Returns logits (B, S, vocab); positions past a length are padding."""
        tokens = self._tokens(tokens, cache)
        B, S = tokens.shape
        lengths = [S] * B if lengths is None else [int(n) for n in lengths]
        if len(lengths) != B or not all(1 <= n <= S for n in lengths):
            raise KvlabError(f"prompt lengths must be {B} numbers in 1..{S}, got {lengths}")
        logits = self.forward_plan(tokens, cache, self.plan(cache, cache.lengths, S))
        cache.set_lengths([h + n for h, n in zip(cache.lengths, lengths)])
        return logits

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per sequence, tokens (B,) -> logits (B, vocab)."""
        tokens = self._tokens(tokens.reshape(-1, 1), cache)
        logits = self.forward_plan(tokens, cache, self.plan(cache, cache.lengths, 1))
        cache.set_lengths([n + 1 for n in cache.lengths])
        return logits[:, 0]

    def _tokens(self, tokens, cache: KVCache) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, device=self.device).long()
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch:
            raise KvlabError(f"tokens must be (batch={cache.batch}, S), got shape {tuple(tokens.shape)}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise KvlabError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        return tokens
