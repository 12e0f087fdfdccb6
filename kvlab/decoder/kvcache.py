"""A static, preallocated KV cache written by index, in fixed-size token blocks, placed on
the compute device or in host memory.

Layout: every K/V plane is block-major, (L, NB, B, KV, blk, D): block j of every sequence
and head sits together, like the block pool of a paged cache whose block table is the
identity. The first nb blocks of a layer are therefore one contiguous slab, which gives
two things a (B, KV, T, D) static cache does not:
- attention over the first n positions is one batched matmul over (nb x B x KV) blocks
  whatever the cache's capacity (a (B, KV, :n, D) view of a longer cache has a batch
  stride oneDNN will not read in place: it copies it first, at a quarter of the speed);
- moving a layer's history between host and device is one contiguous copy, which is what
  a pinned -> device DMA needs (a strided source is staged through pageable memory).
The price: attention reads whole blocks, up to blk - 1 masked positions per sequence.

Placements:
`device`: K/V of every layer live on the compute device.
`host`:   K/V live in host memory (pinned on CUDA) and every forward pass copies each
          layer's history into a device-side working slot before that layer attends:
          the traffic of KV that overflowed HBM. New tokens are written into the slot and
          the blocks they touched are copied back. With `prefetch`, layer l+1 is copied on a
          separate CUDA stream while layer l computes (two slots, events for ordering):
          the article's "pipeline the transfers". On CPU the same copies run host -> host.

Quantized KV (int8, fp8) stores one fp16 scale per (token, KV head), i.e. per head_dim
elements: the ledger's `int8-g<head_dim>`.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ..errors import KvlabError
from ..fmt import si
from . import fit
from .config import KV_DTYPES, MAX_TOKENS, PLACEMENTS, DecoderConfig, check_choice

SCALE_DTYPE = torch.float16
QUANT_MAX = {"int8": 127.0, "fp8": 448.0}
BLOCK_TOKENS = 1024  # big blocks: fewer, larger matmuls (256: 15-20% slower steps on CPU)


def torch_dtype(name: str) -> torch.dtype:
    table = {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "int8": torch.int8,
    }
    if name == "fp8":
        if not hasattr(torch, "float8_e4m3fn"):
            raise KvlabError(
                "kv dtype fp8 needs torch.float8_e4m3fn (torch >= 2.1); "
                f"this is torch {torch.__version__}"
            )
        return torch.float8_e4m3fn
    return table[name]


def quantize(x: torch.Tensor, kv_dtype: str):
    """(..., D) float -> (storage (..., D), fp16 scale (..., 1) or None), absmax per row."""
    if kv_dtype not in QUANT_MAX:
        return x.to(torch_dtype(kv_dtype)), None
    qmax = QUANT_MAX[kv_dtype]
    exact = x.abs().amax(dim=-1, keepdim=True).float() / qmax  # (..., 1)
    scale = exact.to(SCALE_DTYPE)
    # the fp16 scale must not round down, or the largest element would overflow qmax: where
    # it did, add at least one fp16 step (2^-10 relative, 2^-24 absolute for subnormals)
    # before rounding, so the nearest fp16 lies above the exact scale
    up = torch.maximum(exact * (1 + 2.0**-10), exact + 2.0**-24).to(SCALE_DTYPE)
    # (..., 1); rows of zeros get a tiny scale, not 0
    scale = torch.where(scale.float() < exact, up, scale).clamp(min=2.0**-24)
    y = (x.float() / scale.float()).clamp(-qmax, qmax)
    if kv_dtype == "int8":
        y = y.round()
    return y.to(torch_dtype(kv_dtype)), scale


class _Streams:
    """CUDA stream and events of the prefetch pipeline; no-ops where there is nothing to overlap.

    Every stream is the cache's device's (`current_stream(device)`, `Stream(device)`), so a
    cache on cuda:1 never orders its copies against cuda:0's work. `cuda` is the module
    that provides Stream, Event, current_stream and stream (torch.cuda; tests pass stand-ins).
    """

    def __init__(self, device: torch.device, slots: int, prefetch: bool, cuda=None):
        self.active = device.type == "cuda" and prefetch
        if self.active:
            self.cuda, self.device = cuda or torch.cuda, device
            self.copy = self.cuda.Stream(device)
            self.ready = [self.cuda.Event() for _ in range(slots)]
            self.free = [self.cuda.Event() for _ in range(slots)]

    def _compute(self):
        return self.cuda.current_stream(self.device)

    def copy_stream(self):
        return self.cuda.stream(self.copy) if self.active else contextlib.nullcontext()

    def start_pass(self):
        if self.active:  # fetches of this pass come after everything already queued
            self.copy.wait_stream(self._compute())

    def before_copy(self, slot):
        if self.active:  # the slot's previous layer has finished with it
            self.copy.wait_event(self.free[slot])

    def after_copy(self, slot):
        if self.active:
            self.ready[slot].record(self.copy)

    def before_use(self, slot):
        if self.active:
            self._compute().wait_event(self.ready[slot])

    def after_use(self, slot):
        if self.active:
            self.free[slot].record(self._compute())


def cache_footprint(  # noqa: PLR0913 - the cache's shape, keyword-only
    config: DecoderConfig,
    batch: int,
    max_seq_len: int,
    kv_dtype: str,
    placement: str,
    device_type: str,
    prefetch: bool = False,
    block_tokens: int = BLOCK_TOKENS,
) -> tuple[float, float]:
    """(host bytes, device bytes) a `KVCache` of these shapes allocates, computed without
    allocating anything (the memory check and `kvlab bench ... --plan` use it)."""
    blk = min(block_tokens, max_seq_len)
    capacity = math.ceil(max_seq_len / blk) * blk
    itemsize = torch_dtype(kv_dtype).itemsize
    scale = config.num_kv_heads * SCALE_DTYPE.itemsize if kv_dtype in QUANT_MAX else 0
    per_token = config.num_layers * 2 * (config.num_kv_heads * config.head_dim * itemsize + scale)
    total = float(per_token) * batch * capacity
    if placement == "device":
        return (0.0, total) if device_type != "cpu" else (total, 0.0)
    slots = 2 if prefetch and config.num_layers > 1 else 1
    staging = total / config.num_layers * slots
    if device_type == "cpu":
        return total + staging, 0.0
    # pinned host memory comes from a caching allocator that rounds to powers of two
    return 2.0 ** math.ceil(math.log2(max(total, 1.0))), staging


class KVCache:
    """K and V for `batch` sequences of up to `max_seq_len` tokens in every layer."""

    def __init__(  # noqa: PLR0913 - the object's wiring, keyword-only
        self,
        config: DecoderConfig,
        batch: int,
        max_seq_len: int,
        kv_dtype: str = "bf16",
        placement: str = "device",
        device="cpu",
        prefetch: bool = False,
        block_tokens: int = BLOCK_TOKENS,
        chunk_budget_bytes: int | None = None,
    ):
        self.config = config
        self.kv_dtype = check_choice("kv dtype", kv_dtype, KV_DTYPES)
        self.placement = check_choice("placement", placement, PLACEMENTS)
        self.device = torch.device(device)
        sizes = (("batch", batch), ("max_seq_len", max_seq_len), ("block_tokens", block_tokens))
        for name, value in sizes:
            whole = isinstance(value, int) and not isinstance(value, bool)
            if not whole or not 1 <= value <= MAX_TOKENS:
                raise KvlabError(
                    f"KV cache: {name} must be a whole number in 1..{MAX_TOKENS:,}, got {value!r}"
                )
        self.batch, self.max_seq_len = batch, max_seq_len
        self.block_tokens = min(block_tokens, max_seq_len)
        self.num_blocks = math.ceil(max_seq_len / self.block_tokens)
        if prefetch and self.placement != "host":
            raise KvlabError("KV cache: prefetch only applies to placement 'host'")
        self.prefetch = prefetch
        self.quantized = self.kv_dtype in QUANT_MAX
        self.storage_dtype = torch_dtype(self.kv_dtype)
        if chunk_budget_bytes is None:  # dequantized chunk: in L2/L3 on CPU, in L2 on a GPU
            chunk_budget_bytes = (4 << 20) if self.device.type == "cpu" else (32 << 20)
        self.chunk_budget_bytes = chunk_budget_bytes
        self.lengths = [0] * batch
        self._check_memory()
        self._allocate()
        self._n_hist = 0

    # -------------------------------------------------------------- sizes
    @property
    def bytes_per_token(self) -> int:
        """Stored bytes of one token's K/V over all layers, scales included."""
        c = self.config
        per_plane = c.num_kv_heads * c.head_dim * self.storage_dtype.itemsize
        scale = c.num_kv_heads * SCALE_DTYPE.itemsize if self.quantized else 0
        return c.num_layers * 2 * (per_plane + scale)

    @property
    def capacity_tokens(self) -> int:
        """Positions allocated per sequence: max_seq_len rounded up to whole blocks."""
        return self.num_blocks * self.block_tokens

    def blocks(self, n: int) -> int:
        """Blocks that hold the first n positions."""
        return math.ceil(n / self.block_tokens)

    def _slots(self) -> int:
        return 2 if self.prefetch and self.config.num_layers > 1 else 1

    def _needed(self) -> tuple[float, float]:
        """(host bytes, device bytes) this cache will allocate."""
        return cache_footprint(
            self.config,
            self.batch,
            self.max_seq_len,
            self.kv_dtype,
            self.placement,
            self.device.type,
            self.prefetch,
            self.block_tokens,
        )

    def _check_memory(self) -> None:
        host, dev = self._needed()
        what = (
            f"KV cache ({self.batch} x {self.max_seq_len:,} tokens x "
            f"{si(self.bytes_per_token, 'B')}/token, "
            f"{self.kv_dtype}, placement {self.placement})"
        )
        hint = "lower the batch or the context, or quantize the KV (int8/fp8)"
        if host:
            fit.require(what, host, "cpu", hint)
        if dev:
            fit.require(what, dev, self.device, hint)

    # -------------------------------------------------------------- storage
    def _planes(self, lead: int, **where):
        """K, V (and their scales): (lead, NB, B, KV, blk, D) and (lead, NB, B, KV, blk, 1)."""
        c = self.config
        dims = (lead, self.num_blocks, self.batch, c.num_kv_heads, self.block_tokens)
        shapes = [(*dims, c.head_dim)] * 2 + ([(*dims, 1)] * 2 if self.quantized else [])
        dtypes = [self.storage_dtype] * 2 + ([SCALE_DTYPE] * 2 if self.quantized else [])
        return [torch.zeros(s, dtype=d, **where) for s, d in zip(shapes, dtypes, strict=True)]

    def _allocate(self) -> None:
        L = self.config.num_layers
        if self.placement == "device":
            self.store = self._planes(L, device=self.device)
            self.host = self.work = None
        else:
            self.host = self._planes(L, pin_memory=self.device.type == "cuda")
            self.work = self._planes(self._slots(), device=self.device)
            self.store = None
        self.streams = _Streams(self.device, self._slots(), self.prefetch)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for K/V (host and device), working slots included."""
        tensors = (self.store or []) + (self.host or []) + (self.work or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    # -------------------------------------------------------------- contents
    def fill_random_(self, lengths: list[int], seed: int = 0) -> None:
        """Give every sequence `lengths[b]` tokens of random history (benchmarks: the
        values do not change the bytes moved, and prefilling 32K tokens on a CPU takes minutes).
        One random block is tiled over the rest: cheap, and still not zeros."""
        self.set_lengths(lengths)
        planes = self.store if self.placement == "device" else self.host
        nb = self.blocks(max(lengths))
        if nb == 0:
            return
        gen = torch.Generator(device=planes[0].device).manual_seed(seed)
        for i, plane in enumerate(planes):
            head = plane[:, 0]  # (L, B, KV, blk, D|1)
            if i >= 2:  # scales: positive, about the size a unit-variance head gets
                head.fill_(1.0 / 64)
            else:
                tmp = torch.empty(head.shape, dtype=torch.float32, device=head.device)
                if self.quantized:
                    tmp = tmp.uniform_(-100, 100, generator=gen).round_()
                else:
                    tmp = tmp.normal_(generator=gen)
                head.copy_(tmp.to(self.storage_dtype))
            for j in range(1, nb):
                plane[:, j].copy_(head)

    def set_lengths(self, lengths: list[int]) -> None:
        if len(lengths) != self.batch or any(not 0 <= int(n) <= self.max_seq_len for n in lengths):
            raise KvlabError(
                f"KV cache: need {self.batch} lengths in 0..{self.max_seq_len}, got {lengths}"
            )
        self.lengths = [int(n) for n in lengths]

    # -------------------------------------------------------------- one forward pass
    def begin(self, n_hist: int) -> None:
        """Start a pass whose history is the first `n_hist` positions (host: start fetching)."""
        self._n_hist = n_hist
        if self.placement != "host":
            return
        self.streams.start_pass()
        for layer in range(min(self._slots(), self.config.num_layers)):
            self._fetch(layer)

    def _fetch(self, layer: int) -> None:
        """Copy layer `layer`'s history blocks from host memory into its working slot."""
        slot, nb = layer % self._slots(), self.blocks(self._n_hist)
        self.streams.before_copy(slot)
        with self.streams.copy_stream():
            if nb:
                for src, dst in zip(self.host, self.work, strict=True):
                    dst[slot, :nb].copy_(src[layer, :nb], non_blocking=True)  # one contiguous slab
            self.streams.after_copy(slot)

    def layer_ready(self, layer: int) -> None:
        """Before layer `layer` writes or reads its KV: make sure its history has arrived."""
        if self.placement != "host":
            return
        if not self.prefetch and layer > 0:
            self._fetch(layer)  # serial: copy now, on the compute stream
        self.streams.before_use(layer % self._slots())

    def layer_done(self, layer: int) -> None:
        """After layer `layer` attended: its slot may be refilled (prefetch of layer + 2)."""
        if self.placement != "host":
            return
        slots = self._slots()
        self.streams.after_use(layer % slots)
        if self.prefetch and layer + slots < self.config.num_layers:
            self._fetch(layer + slots)

    def write(self, layer: int, k, v, plan) -> None:
        """Store the new tokens' K/V, each (B, KV, S, D), at the positions of `plan`."""
        kq, ks = quantize(k, self.kv_dtype)
        vq, vs = quantize(v, self.kv_dtype)
        new = [kq, vq] + ([ks, vs] if self.quantized else [])
        planes = (
            [p[layer] for p in self.store]
            if self.placement == "device"
            else [p[layer % self._slots()] for p in self.work]
        )
        for dst, x in zip(planes, new, strict=True):
            # dst (NB, B, KV, blk, D) [block, sequence, :, offset] <- x as (B, S, KV, D)
            dst[plan.block_index, plan.batch_rows, :, plan.block_offset] = x.permute(0, 2, 1, 3)
        if self.placement == "host":  # write the touched blocks back to host memory
            b0, b1 = plan.touched_blocks
            for src, dst in zip(planes, self.host, strict=True):
                dst[layer, b0:b1].copy_(src[b0:b1], non_blocking=True)

    def view(self, layer: int, n: int):
        """(k, v, k_scale, v_scale) holding the first n positions, each (nb, B, KV, blk, D|1);
        positions past n are stale and must be masked. Scales are None unless quantized."""
        nb = self.blocks(n)
        if self.placement == "device":
            planes = [p[layer, :nb] for p in self.store]
        else:
            planes = [p[layer % self._slots(), :nb] for p in self.work]
        return (planes + [None, None])[:4]
