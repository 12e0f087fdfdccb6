"""The decoder's matrix products y = x W^T, one small class per backend, chosen once per
weight by `make_linear`:

- `TorchLinear`: `F.linear` on fp32/bf16/fp16 weights (any device; the reference);
- `OneDNNLinear`: CPU bf16 weights handed to oneDNN in its own blocked layout, once (a
  plain bf16 `F.linear` on CPU re-lays the weight out on every call and streams it at
  ~70% of the copy bandwidth; prepacked, as inductor does when it freezes a model, it
  streams at about the copy bandwidth, bit for bit the same numbers);
- `NativeLinear`: CPU bf16 weights packed for kvlab's matrix-vector kernel
  (`kvlab.native`): decode rows stream the weight at memory speed; prefill
  (compute-bound) uses a second copy in oneDNN's layout, built on first use;
- `Int8Linear`: int8 weights with one scale per output row, through torch's fused
  weight-only kernel (1 byte per weight moved) where it runs, else dequantize + matmul.

Every class keeps `nbytes`, the bytes one pass streams (the ledger's weight bytes), and
`backend`, its name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native
from .kvcache import torch_dtype

#: Backends a decoder can ask for; "native" falls back to "onednn", then "torch".
BACKENDS = ("torch", "onednn", "native")


class Linear(torch.nn.Module):
    """y = x W^T with W (out, in); subclasses say how."""

    backend = "torch"

    def __init__(self, in_features: int, out_features: int, nbytes: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.nbytes = nbytes  # what one pass streams (packing does not change it)


class TorchLinear(Linear):
    """PyTorch's `F.linear` on a plain fp32/bf16/fp16 weight."""

    def __init__(self, weight: torch.Tensor):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, weight.numel() * weight.element_size())
        self.register_buffer("weight", weight)

    def forward(self, x):
        return F.linear(x.to(self.weight.dtype), self.weight)


class OneDNNLinear(Linear):
    """A CPU bf16 weight in oneDNN's blocked layout (an opaque mkldnn tensor)."""

    backend = "onednn"

    def __init__(self, weight: torch.Tensor, packed: torch.Tensor):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, weight.numel() * weight.element_size())
        self.register_buffer("weight", packed)

    def forward(self, x):
        return _onednn_linear(x, self.weight)


class NativeLinear(Linear):
    """A CPU bf16 weight packed for `kvlab.native.gemv_bf16`; prefill through oneDNN."""

    backend = "native"

    def __init__(self, weight: torch.Tensor):
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, weight.numel() * weight.element_size())
        self.register_buffer("weight", native.pack_weight(weight))
        self._gemm_weight = None  # (the prefill copy, whether it is in oneDNN's layout)

    def forward(self, x):
        if x.numel() // self.in_features <= native.MAX_GEMV_ROWS:
            return native.gemv_bf16(x, self.weight, self.out_features)
        return self._gemm(x)

    def _gemm(self, x):
        """Many rows (prefill, compute-bound): oneDNN's GEMM on a second copy of the weight
        in oneDNN's layout (plain where that is unavailable), built on first use."""
        if self._gemm_weight is None:
            plain = native.unpack_weight(self.weight, self.out_features).contiguous()
            packed = onednn_layout(plain)
            self._gemm_weight = (plain, False) if packed is None else (packed, True)
        w, onednn = self._gemm_weight
        return _onednn_linear(x, w) if onednn else F.linear(x.to(torch.bfloat16), w)


class Int8Linear(Linear):
    """int8 weights, one scale per output row (in the compute dtype); activations stay
    in the compute dtype."""

    backend = "int8"

    def __init__(self, weight: torch.Tensor, compute_dtype: torch.dtype):
        out_features, in_features = weight.shape
        scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # (out,)
        q = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        scale = scale.to(compute_dtype)
        streamed = q.numel() + scale.numel() * scale.element_size()
        super().__init__(in_features, out_features, streamed)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)  # (out,)
        self.fused = int8_matmul_supported(weight.device, in_features, compute_dtype)

    def forward(self, x):
        if self.fused:
            flat = x.reshape(-1, self.in_features).contiguous()  # (tokens, in)
            y = torch._weight_int8pack_mm(flat, self.weight, self.scale)
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight.to(x.dtype)) * self.scale  # moves more than 1 byte/weight


def make_linear(
    in_features: int,
    out_features: int,
    weight_dtype: str,
    compute_dtype: torch.dtype,
    device,
    generator: torch.Generator,
    backend: str = "torch",
) -> Linear:
    """A random (out, in) weight, scaled by in^-1/2, behind the best `backend` that takes it.

    The weight is drawn the same way whatever the backend, so one seed gives the same
    numbers through every backend."""
    w = torch.randn(out_features, in_features, generator=generator, device=device)
    w = w * in_features**-0.5
    if weight_dtype == "int8":
        return Int8Linear(w, compute_dtype)
    w = w.to(torch_dtype(weight_dtype))
    if backend == "native" and native.gemv_supported(w):
        return NativeLinear(w)
    if backend in ("native", "onednn") and w.device.type == "cpu" and w.dtype == torch.bfloat16:
        packed = onednn_layout(w)
        if packed is not None:
            return OneDNNLinear(w, packed)
    return TorchLinear(w)


def _onednn_linear(x, packed):
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, None, "none", [], "")


def _prepack_supported() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def onednn_layout(weight: torch.Tensor):
    """A bf16 CPU weight (out, in) reordered into oneDNN's blocked layout, checked bit for
    bit against F.linear on a probe; None where that is unavailable."""
    if not _prepack_supported():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        gen = torch.Generator().manual_seed(0)
        probe = torch.randn(3, weight.shape[1], generator=gen).to(torch.bfloat16)
        ok = torch.equal(_onednn_linear(probe, packed), F.linear(probe, weight))
    except RuntimeError:
        return None
    return packed if ok else None


_INT8_PROBED: dict = {}


def int8_matmul_supported(device: torch.device, in_features: int, dtype: torch.dtype) -> bool:
    """Whether torch's fused weight-only int8 matmul can run this shape.

    On CPU `_weight_int8pack_mm` reads int8 weights straight from memory (1 byte per
    weight moved); it crashes on inner dimensions that are not a multiple of 16, so those
    use the dequantize-then-matmul fallback. Other devices: probed once.
    """
    device = torch.device(device)
    if not hasattr(torch, "_weight_int8pack_mm") or in_features % 16:
        return False
    if device.type == "cpu":
        return dtype in (torch.float32, torch.bfloat16)
    key = (str(device), dtype)
    if key not in _INT8_PROBED:
        try:
            w = torch.zeros(32, 32, dtype=torch.int8, device=device)
            torch._weight_int8pack_mm(
                torch.zeros(2, 32, dtype=dtype, device=device),
                w,
                torch.ones(32, dtype=dtype, device=device),
            )
            _INT8_PROBED[key] = True
        except (RuntimeError, NotImplementedError):
            _INT8_PROBED[key] = False
    return _INT8_PROBED[key]
