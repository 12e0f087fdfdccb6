"""A static, preallocated KV cache written by index (gpt-fast style), placed on the
compute device or in host memory.

`device`: K/V of every layer live on the compute device, shape (L, B, KV, T, D).
`host`:   K/V live in host memory (pinned on CUDA) and every forward pass copies each
          layer's history to a device-side working buffer before that layer attends:
          the traffic of KV that overflowed HBM. With `prefetch`, layer l+1 is copied
          on a separate CUDA stream while layer l computes (two working slots, events
          for ordering): the article's "pipeline the transfers". On CPU the same copy
          path runs host -> host, without streams.

Host layout: 'tnd' (L, T, B, KV, D) makes every layer's history one contiguous block,
which a pinned -> device copy needs (a strided source would be staged through pageable
memory); it lands in a contiguous buffer and is transposed on the device into the
(B, KV, T, D) layout the attention reads. 'hnd' (L, B, KV, T, D) skips the landing
buffer, which is cheaper on CPU where both sides are host memory.

Quantized KV (int8, fp8) stores one fp16 scale per (token, KV head), i.e. per head_dim
elements: the ledger's `int8-g<head_dim>`.
"""
from __future__ import annotations

import contextlib

import torch

from ..errors import KvlabError
from ..fmt import si
from . import fit
from .config import KV_DTYPES, PLACEMENTS, DecoderConfig, check_choice

SCALE_DTYPE = torch.float16
QUANT_MAX = {"int8": 127.0, "fp8": 448.0}


def torch_dtype(name: str) -> torch.dtype:
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8}
    if name == "fp8":
        if not hasattr(torch, "float8_e4m3fn"):
            raise KvlabError(f"kv dtype fp8 needs torch.float8_e4m3fn (torch >= 2.1); this is torch {torch.__version__}")
        return torch.float8_e4m3fn
    return table[name]


def quantize(x: torch.Tensor, kv_dtype: str):
    """(..., D) float -> (storage (..., D), fp16 scale (..., 1) or None), absmax per row."""
    if kv_dtype not in QUANT_MAX:
        return x.to(torch_dtype(kv_dtype)), None
    qmax = QUANT_MAX[kv_dtype]
    exact = x.abs().amax(dim=-1, keepdim=True).float() / qmax  # (..., 1)
    scale = exact.to(SCALE_DTYPE)
    # round the fp16 scale up, never down, so that no element overflows qmax; rows of
    # zeros get the smallest subnormal instead of a zero scale
    scale = torch.where(scale.float() < exact, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    scale = scale.clamp(min=2.0 ** -24)  # (..., 1)
    y = (x.float() / scale.float()).clamp(-qmax, qmax)
    if kv_dtype == "int8":
        y = y.round()
    return y.to(torch_dtype(kv_dtype)), scale


class _Streams:
    """CUDA stream and events of the prefetch pipeline; no-ops where there is nothing to overlap."""

    def __init__(self, device: torch.device, slots: int, prefetch: bool):
        self.active = device.type == "cuda" and prefetch
        if self.active:
            self.copy = torch.cuda.Stream(device)
            self.ready = [torch.cuda.Event() for _ in range(slots)]
            self.free = [torch.cuda.Event() for _ in range(slots)]

    def copy_stream(self):
        return torch.cuda.stream(self.copy) if self.active else contextlib.nullcontext()

    def start_pass(self):
        if self.active:  # fetches of this pass come after everything already queued
            self.copy.wait_stream(torch.cuda.current_stream())

    def before_copy(self, slot):
        if self.active:  # the slot's previous layer has finished reading it
            self.copy.wait_event(self.free[slot])

    def after_copy(self, slot):
        if self.active:
            self.ready[slot].record(self.copy)

    def before_use(self, slot):
        if self.active:
            torch.cuda.current_stream().wait_event(self.ready[slot])

    def after_use(self, slot):
        if self.active:
            self.free[slot].record(torch.cuda.current_stream())


class KVCache:
    """K and V for `batch` sequences of up to `max_seq_len` tokens in every layer."""

    def __init__(self, config: DecoderConfig, batch: int, max_seq_len: int, kv_dtype: str = "bf16",
                 placement: str = "device", device="cpu", prefetch: bool = False, host_layout: str = "auto",
                 chunk_budget_bytes: int | None = None):
        self.config = config
        self.kv_dtype = check_choice("kv dtype", kv_dtype, KV_DTYPES)
        self.placement = check_choice("placement", placement, PLACEMENTS)
        self.device = torch.device(device)
        for name, value in (("batch", batch), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000_000:
                raise KvlabError(f"KV cache: {name} must be a whole number >= 1, got {value!r}")
        self.batch, self.max_seq_len = batch, max_seq_len
        if prefetch and self.placement != "host":
            raise KvlabError("KV cache: prefetch only applies to placement 'host'")
        self.prefetch = prefetch
        self.quantized = self.kv_dtype in QUANT_MAX
        self.storage_dtype = torch_dtype(self.kv_dtype)
        if host_layout == "auto":
            host_layout = "tnd" if self.device.type == "cuda" else "hnd"
        self.host_layout = check_choice("host layout", host_layout, ("tnd", "hnd"))
        if chunk_budget_bytes is None:  # dequantized chunk: in L2/L3 on CPU, in L2 on a GPU
            chunk_budget_bytes = (4 << 20) if self.device.type == "cpu" else (32 << 20)
        self.chunk_budget_bytes = chunk_budget_bytes
        self.lengths = [0] * batch
        self._check_memory()
        self._allocate()
        self._n_hist = 0

    # -------------------------------------------------------------- sizes
    @property
    def planes(self) -> int:
        """K, V, and their scales when quantized."""
        return 4 if self.quantized else 2

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes of one token's K/V over all layers, scales included."""
        c = self.config
        per_plane = c.num_kv_heads * c.head_dim * self.storage_dtype.itemsize
        scale = c.num_kv_heads * SCALE_DTYPE.itemsize if self.quantized else 0
        return c.num_layers * 2 * (per_plane + scale)

    def _slots(self) -> int:
        return 2 if self.prefetch and self.config.num_layers > 1 else 1

    def _needed(self) -> tuple[float, float]:
        """(host bytes, device bytes) this cache will allocate."""
        total = float(self.bytes_per_token) * self.batch * self.max_seq_len
        if self.placement == "device":
            return (0.0, total) if self.device.type != "cpu" else (total, 0.0)
        per_layer = total / self.config.num_layers
        landing = per_layer * self._slots() if self.host_layout == "tnd" else 0.0
        staging = per_layer * self._slots() + landing
        if self.device.type == "cpu":
            return total + staging, 0.0
        return total, staging

    def _check_memory(self) -> None:
        host, dev = self._needed()
        what = (f"KV cache ({self.batch} x {self.max_seq_len:,} tokens x {si(self.bytes_per_token, 'B')}/token, "
                f"{self.kv_dtype}, placement {self.placement})")
        hint = "lower the batch or the context, or quantize the KV (int8/fp8)"
        if host:
            fit.require(what, host, "cpu", hint)
        if dev:
            fit.require(what, dev, self.device, hint)

    # -------------------------------------------------------------- storage
    def _plane_shapes(self, layout: str, lead: int):
        c = self.config
        dims = {"hnd": (self.batch, c.num_kv_heads, self.max_seq_len), "tnd": (self.max_seq_len, self.batch, c.num_kv_heads)}[layout]
        value = (lead, *dims, c.head_dim)
        scale = (lead, *dims, 1)
        shapes = [value, value] + ([scale, scale] if self.quantized else [])
        dtypes = [self.storage_dtype] * 2 + ([SCALE_DTYPE] * 2 if self.quantized else [])
        return list(zip(shapes, dtypes))

    def _allocate(self) -> None:
        L = self.config.num_layers
        if self.placement == "device":
            # (L, B, KV, T, D) per plane on the compute device
            self.store = [torch.zeros(s, dtype=d, device=self.device) for s, d in self._plane_shapes("hnd", L)]
            self.host = self.work = self.landing = None
            self.streams = _Streams(self.device, 1, False)
            return
        pin = self.device.type == "cuda"
        # host planes: (L, T, B, KV, D) 'tnd' or (L, B, KV, T, D) 'hnd'
        self.host = [torch.zeros(s, dtype=d, pin_memory=pin) for s, d in self._plane_shapes(self.host_layout, L)]
        slots = self._slots()
        # device working slots: (slots, B, KV, T, D); landing for contiguous copies: (slots, T, B, KV, D)
        self.work = [torch.zeros(s, dtype=d, device=self.device) for s, d in self._plane_shapes("hnd", slots)]
        self.landing = None
        if self.host_layout == "tnd":
            self.landing = [torch.zeros(s, dtype=d, device=self.device) for s, d in self._plane_shapes("tnd", slots)]
        self.store = None
        self.streams = _Streams(self.device, slots, self.prefetch)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for K/V (host and device), staging buffers included."""
        tensors = (self.store or []) + (self.host or []) + (self.work or []) + (self.landing or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    # -------------------------------------------------------------- contents
    def fill_random_(self, lengths: list[int], seed: int = 0) -> None:
        """Give every sequence `lengths[b]` tokens of random history (benchmarks: the
        values do not change the bytes moved, and prefilling 32K tokens on a CPU takes minutes)."""
        self.set_lengths(lengths)
        planes = self.store if self.placement == "device" else self.host
        tnd = self.placement == "host" and self.host_layout == "tnd"
        gen_device = planes[0].device
        g = torch.Generator(device=gen_device).manual_seed(seed)
        n = max(lengths)
        if n == 0:
            return
        seed_tokens = min(n, 256)
        for i, plane in enumerate(planes):
            for layer in range(plane.shape[0]):
                view = plane[layer, :n] if tnd else plane[layer, :, :, :n]  # (n, B, KV, D) or (B, KV, n, D)
                axis = 0 if tnd else 2
                head = view.narrow(axis, 0, seed_tokens)
                if i >= 2:  # scales: positive, about the size a unit-variance head gets
                    head.fill_(1.0 / 64)
                else:
                    tmp = torch.empty(head.shape, dtype=torch.float32, device=gen_device)
                    tmp = tmp.uniform_(-100, 100, generator=g).round_() if self.quantized else tmp.normal_(generator=g)
                    head.copy_(tmp.to(self.storage_dtype))
                filled = seed_tokens  # tile the random block over the rest: cheap, and still not zeros
                while filled < n:
                    m = min(filled, n - filled)
                    view.narrow(axis, filled, m).copy_(view.narrow(axis, 0, m))
                    filled += m

    def set_lengths(self, lengths: list[int]) -> None:
        if len(lengths) != self.batch or any(not 0 <= int(n) <= self.max_seq_len for n in lengths):
            raise KvlabError(f"KV cache: need {self.batch} lengths in 0..{self.max_seq_len}, got {lengths}")
        self.lengths = [int(n) for n in lengths]

    def reset(self) -> None:
        self.lengths = [0] * self.batch

    # -------------------------------------------------------------- one forward pass
    def begin(self, n_hist: int) -> None:
        """Start a pass whose history is the first `n_hist` positions (host: start fetching)."""
        self._n_hist = n_hist
        if self.placement != "host":
            return
        self.streams.start_pass()
        for layer in range(self._slots()):
            self._fetch(layer)

    def _fetch(self, layer: int) -> None:
        """Copy layer `layer`'s history from host memory into its working slot."""
        slot, n = layer % self._slots(), self._n_hist
        self.streams.before_copy(slot)
        with self.streams.copy_stream():
            if n:
                for i, src in enumerate(self.host):
                    dst = self.work[i][slot, :, :, :n]  # (B, KV, n, D)
                    if self.landing is None:
                        dst.copy_(src[layer, :, :, :n], non_blocking=True)  # hnd -> hnd
                    else:
                        land = self.landing[i][slot, :n]  # (n, B, KV, D) contiguous
                        land.copy_(src[layer, :n], non_blocking=True)  # one contiguous host -> device copy
                        dst.copy_(land.permute(1, 2, 0, 3))  # (n, B, KV, D) -> (B, KV, n, D) on the device
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
        """Store the new tokens' K/V (B, KV, S, D) at their positions (plan: a StepPlan)."""
        kq, ks = quantize(k, self.kv_dtype)
        vq, vs = quantize(v, self.kv_dtype)
        new = [kq, vq] + ([ks, vs] if self.quantized else [])  # each (B, KV, S, D or 1)
        if self.placement == "device":
            for dst, x in zip(self.store, new):
                _put_hnd(dst[layer], x, plan)
            return
        slot = layer % self._slots()
        for i, x in enumerate(new):
            _put_hnd(self.work[i][slot], x, plan)
            if self.host_layout == "hnd":
                _put_hnd(self.host[i][layer], x, plan)
            else:
                _put_tnd(self.host[i][layer], x, plan)

    def view(self, layer: int, n: int):
        """(k, v, k_scale, v_scale) of the first n positions, each (B, KV, n, D|1); scales None unless quantized."""
        if self.placement == "device":
            planes = [p[layer, :, :, :n] for p in self.store]
        else:
            slot = layer % self._slots()
            planes = [p[slot, :, :, :n] for p in self.work]
        return (planes + [None, None])[:4]


def _put_hnd(dst, x, plan) -> None:
    """dst (B, KV, T, D), x (B, KV, S, D): write at each sequence's positions."""
    if plan.uniform:
        p = plan.hist[0]
        dst[:, :, p:p + x.shape[2]].copy_(x, non_blocking=True)
    elif dst.device == x.device:  # ragged decode: one token per sequence at its own position
        dst[plan.batch_index, :, plan.write_pos] = x[:, :, 0]
    else:
        for b, p in enumerate(plan.hist):
            dst[b, :, p].copy_(x[b, :, 0], non_blocking=True)  # (KV, D)


def _put_tnd(dst, x, plan) -> None:
    """dst (T, B, KV, D) in host memory, x (B, KV, S, D) on the device."""
    if plan.uniform:
        p = plan.hist[0]
        dst[p:p + x.shape[2]].copy_(x.permute(2, 0, 1, 3), non_blocking=True)  # (S, B, KV, D)
    else:
        for b, p in enumerate(plan.hist):
            dst[p, b].copy_(x[b, :, 0], non_blocking=True)  # (KV, D)
