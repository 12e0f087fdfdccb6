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
from ..cost import weight_bytes
from ..errors import KvlabError
from . import fit
from .attention import decode_attention, gather, prefill_attention, softmax_scale
from .config import WEIGHT_DTYPES, DecoderConfig, check_choice, get_config
from .kvcache import KVCache, torch_dtype
from .ledger import model_spec, weight_ledger_dtype
from .linear import Linear, NativeLinear, OneDNNLinear, make_linear

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
    def __init__(self, c: DecoderConfig, weight_dtype, compute_dtype, device, g, backend: str):
        super().__init__()
        qkv_out = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim

        def linear(in_features, out_features):
            return make_linear(
                in_features, out_features, weight_dtype, compute_dtype, device, g, backend
            )

        self.attention_norm = RMSNorm(c.hidden_size, c.norm_eps, compute_dtype, device)
        self.wqkv = linear(c.hidden_size, qkv_out)  # fused q, k, v
        self.wo = linear(c.num_heads * c.head_dim, c.hidden_size)
        self.ffn_norm = RMSNorm(c.hidden_size, c.norm_eps, compute_dtype, device)
        self.w13 = linear(c.hidden_size, 2 * c.intermediate_size)  # gate | up
        self.w2 = linear(c.intermediate_size, c.hidden_size)


def apply_rope(x, rot):
    """x (B, S, heads, D), rot (B, S, 1, D/2) complex (cos + i sin): rotate consecutive pairs
    (Meta's layout) as one complex multiply, a quarter of the ops of the real-valued form."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, S, heads, D/2)
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)  # (B, S, heads, D)


class Decoder(torch.nn.Module):
    """A Llama-style decoder with random weights; KV lives in a `KVCache` passed to each call."""

    def __init__(  # noqa: PLR0913 - the object's wiring, keyword-only
        self,
        config: DecoderConfig | str = "tiny",
        weight_dtype: str = "fp32",
        device="cpu",
        compute_dtype: str | None = None,
        seed: int = 0,
        prefill_kernel: str = "auto",
        prepack: bool = True,
        kernels: str = "auto",
    ):
        """`kernels`: decode kernels on CPU. "native" = kvlab's C kernels (bf16 weights and KV
        streamed at memory speed), "torch" = PyTorch's, "auto" = whichever of the two a short
        timing on this machine found faster (`kvlab.decoder.tune`, once per machine).
        `prepack`: CPU bf16 weights not taken by the native kernels go to oneDNN prepacked."""
        super().__init__()
        c = self.config = get_config(config)
        self.weight_dtype = check_choice("weight dtype", weight_dtype, WEIGHT_DTYPES)
        self.compute_dtype_name = compute_dtype or (
            self.weight_dtype if self.weight_dtype in FLOAT_DTYPES else "bf16"
        )
        check_choice("compute dtype", self.compute_dtype_name, FLOAT_DTYPES)
        self.compute_dtype = torch_dtype(self.compute_dtype_name)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise KvlabError("device 'cuda' asked for, but torch sees no CUDA device")
        self.prefill_kernel = check_choice(
            "prefill kernel", prefill_kernel, ("auto", "sdpa", "matmul")
        )
        asked = check_choice("kernels", kernels, KERNELS)
        #: the timed kernel choice (`kvlab.decoder.tune.choice`), where one was consulted
        self.kernel_choice: dict | None = None
        self.kernels, self.kernels_note = self._pick_kernels(asked)
        backend = "native" if self.kernels == "native" else "onednn" if prepack else "torch"
        self._check_memory()
        g = torch.Generator(device=self.device).manual_seed(seed)
        embeddings = torch.randn(c.vocab_size, c.hidden_size, generator=g, device=self.device)
        # gathered, not streamed
        self.tok_embeddings = torch.nn.Parameter(
            embeddings.to(self.compute_dtype), requires_grad=False
        )
        self.layers = torch.nn.ModuleList(
            Block(c, self.weight_dtype, self.compute_dtype, self.device, g, backend)
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.norm_eps, self.compute_dtype, self.device)
        self.output = make_linear(
            c.hidden_size,
            c.vocab_size,
            self.weight_dtype,
            self.compute_dtype,
            self.device,
            g,
            backend,
        )
        self._rope = torch.empty(0, dtype=torch.complex64)
        self.requires_grad_(False)
        #: how many weights went to oneDNN prepacked (0: none, or this torch cannot)
        self.prepacked = sum(isinstance(m, OneDNNLinear) for m in self.linears())

    def linears(self) -> list[Linear]:
        """Every matrix product of a forward pass (the streamed weights)."""
        return [m for m in self.modules() if isinstance(m, Linear)]

    def decode_kernels(self, kv_dtype: str) -> dict:
        """Which kernels a decode step runs: {"weights": ..., "attention": ...}, each
        "native" or "torch" (native attention takes bf16 or int8 KV with head_dim % 64 == 0)."""
        on_native = [isinstance(m, NativeLinear) for m in self.linears()]
        weights = (
            "native" if on_native and all(on_native) else "mixed" if any(on_native) else "torch"
        )
        attention = (
            "native"
            if (
                self.kernels == "native"
                and kv_dtype in ("bf16", "int8")
                and self.config.head_dim % 64 == 0
                and self.config.head_dim <= native.MAX_HEAD_DIM
            )
            else "torch"
        )
        return {"weights": weights, "attention": attention}

    def kernels_environment(self) -> dict:
        """What a benchmark records about the kernels: which set, why, and where one was timed,
        the native variant in use and every candidate's timing."""
        env = {"kernels": self.kernels, "kernels_note": self.kernels_note}
        if self.kernel_choice is not None:
            from . import tune  # noqa: PLC0415 - torch loads only when used

            timed = self.kernel_choice
            env["kernel_timing"] = {
                "note": tune.note(timed),
                **{k: timed[k] for k in ("kernels", "native", "torch_total_s", "timings_s")},
                "working_set_bytes": timed["working_set_bytes"],
            }
            if self.kernels == "native":
                env["kernel_variant"] = native.variant()
        return env

    def _pick_kernels(self, asked: str) -> tuple[str, str]:
        """("native" | "torch", one line saying why). "auto" on a CPU where the native kernels
        build takes whichever kernel set `tune.choice()` timed faster on this machine (and
        "native" its fastest variant); the choice is timed once per machine and cached."""
        if self.device.type != "cpu":
            if asked == "native":
                raise KvlabError(
                    f"kernels 'native' are CPU kernels; on {self.device.type} use 'torch' or 'auto'"
                )
            return "torch", f"PyTorch kernels on {self.device.type}"
        if asked == "torch":
            return "torch", "PyTorch kernels (asked for)"
        if not native.available():
            if asked == "native":
                raise KvlabError(
                    f"kernels 'native' asked for, but they are unavailable here: {native.status()}"
                )
            return "torch", native.status()
        from . import tune  # noqa: PLC0415 - torch loads only when used

        timed = tune.choice()
        self.kernel_choice = timed
        best = tune.require_native(timed)
        native.set_variant(best["weights"], best["attention"], best.get("attention_int8"))
        if asked == "auto" and timed["kernels"] == "torch":
            return "torch", "PyTorch kernels (timed faster here than kvlab's native kernels)"
        return "native", native.status()

    def _check_memory(self) -> None:
        needed = weight_bytes(
            model_spec(self.config), weight_ledger_dtype(self.config, self.weight_dtype)
        )
        fit.require(
            f"decoder '{self.config.name}' weights ({self.weight_dtype})",
            needed,
            self.device,
            "pick a smaller preset or int8 weights",
        )

    # ------------------------------------------------------------ sizes
    def streamed_weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads: everything but the embedding table."""
        linears = sum(m.nbytes for m in self.linears())
        norms = sum(
            m.weight.numel() * m.weight.element_size()
            for m in self.modules()
            if isinstance(m, RMSNorm)
        )
        return linears + norms

    def new_cache(
        self,
        batch: int,
        max_seq_len: int,
        kv_dtype: str = "bf16",
        placement: str = "device",
        prefetch: bool = False,
        **kwargs,
    ) -> KVCache:
        """A KV cache for this model on its device (kwargs: block_tokens, chunk_budget_bytes)."""
        return KVCache(
            self.config, batch, max_seq_len, kv_dtype, placement, self.device, prefetch, **kwargs
        )

    # ------------------------------------------------------------ planning
    def _rope_tables(self, n: int):
        """(T, D/2) complex64 rotations cos + i sin for positions 0..T-1, T >= n."""
        if self._rope.shape[0] < n:
            size = max(n, 2 * self._rope.shape[0], 256)
            d = self.config.head_dim
            even = torch.arange(0, d, 2, device=self.device, dtype=torch.float32)
            inv = 1.0 / (self.config.rope_theta ** (even / d))
            positions = torch.arange(size, device=self.device, dtype=torch.float32)
            angles = torch.outer(positions, inv)  # (T, D/2)
            self._rope = torch.polar(torch.ones_like(angles), angles)
        return self._rope

    def plan(self, cache: KVCache, hist: list[int], new_tokens: int) -> StepPlan:
        """Index tensors for `new_tokens` per sequence after `hist[b]` cached ones."""
        B = cache.batch
        if len(hist) != B:
            raise KvlabError(f"need one history length per sequence ({B}), got {len(hist)}")
        if new_tokens < 1 or max(hist) + new_tokens > cache.max_seq_len:
            raise KvlabError(
                f"{max(hist)} cached + {new_tokens} new tokens exceed the cache's "
                f"max_seq_len {cache.max_seq_len}; allocate a longer cache"
            )
        if len(set(hist)) > 1 and new_tokens != 1:
            raise KvlabError(
                "sequences with different cached lengths can only decode one token at a time"
            )
        n_total = max(hist) + new_tokens
        self._rope_tables(n_total)
        dev, blk = self.device, cache.block_tokens
        first = torch.tensor(hist, dtype=torch.long, device=dev).view(B, 1)  # (B, 1)
        positions = first + torch.arange(new_tokens, device=dev).view(1, -1)  # (B, S)
        span = cache.blocks(n_total) * blk
        valid = None
        if new_tokens == 1 and (len(set(hist)) > 1 or n_total < span):
            # (B, 1, 1, nb*blk)
            valid = (torch.arange(span, device=dev).view(1, -1) <= first).view(B, 1, 1, span)
        sdpa = (
            new_tokens > 1
            and max(hist) == 0
            and (
                self.prefill_kernel == "sdpa"
                or (self.prefill_kernel == "auto" and dev.type == "cuda")
            )
        )
        touched = (min(hist) // blk, (n_total - 1) // blk + 1)
        return StepPlan(
            list(hist),
            new_tokens,
            n_total,
            positions,
            first,
            valid,
            positions // blk,
            positions % blk,
            torch.arange(B, device=dev).view(B, 1).expand(B, new_tokens),
            touched,
            sdpa,
            (first + new_tokens).view(B),
        )

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
            y = self.attend(q, cache, i, plan)  # (B, H, S, D)
            cache.layer_done(i)
            y = y.to(self.compute_dtype).transpose(1, 2).reshape(B, S, H * D)  # (B, S, H*D)
            x = x + layer.wo(y)
            gate, up = layer.w13(layer.ffn_norm(x)).chunk(2, dim=-1)  # (B, S, I) each
            x = x + layer.w2(F.silu(gate) * up)
        return self.output(self.norm(x)).float()  # (B, S, vocab)

    def attend(self, q: torch.Tensor, cache: KVCache, layer: int, plan: StepPlan) -> torch.Tensor:
        """Layer `layer`'s attention of q (B, H, S, D) over the cache as planned, with the
        kernels this decoder runs (the benchmark's kernel table times this same call)."""
        kk, vv, ks, vs = cache.view(layer, plan.n_total)  # (nb, B, KV, blk, D), scales (..., 1)
        if plan.new_tokens == 1:
            if self.kernels == "native" and native.attention_supported(kk, ks, q.shape[-1]):
                return native.decode_attention(q, kk, vv, plan.kv_lengths, ks, vs)
            return decode_attention(q, kk, vv, ks, vs, plan.valid, cache.chunk_budget_bytes)
        work = kk.dtype if ks is None else self.compute_dtype
        return prefill_attention(
            q, gather(kk, ks, work), gather(vv, vs, work), plan.first_pos, plan.sdpa
        )

    @torch.no_grad()
    def prefill(
        self, tokens: torch.Tensor, cache: KVCache, lengths: list[int] | None = None
    ) -> torch.Tensor:
        """Append a prompt to every sequence: tokens (B, S), right-padded when `lengths`
        (each <= S) differ. Returns logits (B, S, vocab); positions past a length are padding."""
        tokens = self._tokens(tokens, cache)
        B, S = tokens.shape
        lengths = [S] * B if lengths is None else [int(n) for n in lengths]
        if len(lengths) != B or not all(1 <= n <= S for n in lengths):
            raise KvlabError(f"prompt lengths must be {B} numbers in 1..{S}, got {lengths}")
        logits = self.forward_plan(tokens, cache, self.plan(cache, cache.lengths, S))
        cache.set_lengths([h + n for h, n in zip(cache.lengths, lengths, strict=True)])
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
            raise KvlabError(
                f"tokens must be (batch={cache.batch}, S), got shape {tuple(tokens.shape)}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise KvlabError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        return tokens
