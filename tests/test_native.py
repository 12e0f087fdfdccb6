"""kvlab's native CPU decode kernels: same numbers as an fp32 reference, every shape the
decoder can hand them, clear errors for the rest, and the build/fallback behaviour.

Tolerances: bf16 inputs, fp32 accumulation. The matrix-vector product returns bf16, so it
may differ from torch's bf16 matmul by one bf16 rounding step (2^-8 relative) of the
output; attention (fp32 output, fp32 softmax and p) is compared with an fp32 computation on
the same bf16 inputs, max |diff| <= 2e-3 at outputs of magnitude ~1 (seen ~1e-6 to 1e-4),
and must be at least as close as the PyTorch path (which rounds p to bf16).
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from kvlab import native  # noqa: E402
from kvlab.decoder import Decoder  # noqa: E402
from kvlab.decoder.attention import decode_attention  # noqa: E402
from kvlab.decoder.kvcache import quantize  # noqa: E402
from kvlab.errors import KvlabError  # noqa: E402

needs_native = pytest.mark.skipif(
    not native.available(), reason=f"native kernels unavailable: {native.status()}"
)


def test_native_builds_wherever_cpu_and_compiler_allow():
    """The tests below skip without the kernels; this one makes sure that is never because the
    source stopped compiling on a machine that should build it."""

    _, flags = native._cpu()
    if (
        os.environ.get("KVLAB_NATIVE", "1") == "0"
        or not native._compiler()[0]
        or platform.machine().lower() not in ("x86_64", "amd64")
        or not all(f in flags for f in native.REQUIRED_CPU_FLAGS)
    ):
        pytest.skip(f"this machine cannot build the kernels: {native.status()}")
    assert native.available(), native.status()


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


#: Every variant of the kernels the tuner may pick (prefetch hint x AMX tiles): each must give
#: the same numbers. AMX variants run only where the CPU and the OS allow tiles.
VARIANTS = [
    pytest.param((hint, amx), id=f"{hint}{'-amx' if amx else ''}")
    for hint in native.PREFETCH_HINTS
    for amx in (False, True)
]


@pytest.fixture(params=VARIANTS)
def variant(request):
    hint, amx = request.param
    if amx and not native.amx_available():
        pytest.skip("no AMX tiles on this machine")
    return {"prefetch": hint, "amx": amx}


def attention_reference(q, k, v, lengths):
    """fp32 softmax(q k^T) v over each sequence's first lengths[b] positions; (B, H, 1, D)."""
    nb, B, KV, blk, D = k.shape
    H = q.shape[1]
    kf = k.float().permute(1, 2, 0, 3, 4).reshape(B, KV, nb * blk, D)
    vf = v.float().permute(1, 2, 0, 3, 4).reshape(B, KV, nb * blk, D)
    out = torch.empty(B, H, 1, D)
    for b in range(B):
        n = int(lengths[b])
        for h in range(H):
            kvh = h // (H // KV)
            p = torch.softmax(q[b, h, 0].float() @ kf[b, kvh, :n].T, dim=-1)
            out[b, h, 0] = p @ vf[b, kvh, :n]
    return out


def random_attention(B, H, KV, D, nb, blk, seed=0):
    g = gen(seed)
    q = (torch.randn(B, H, 1, D, generator=g) / math.sqrt(D)).bfloat16()
    k = torch.randn(nb, B, KV, blk, D, generator=g).bfloat16()
    v = torch.randn(nb, B, KV, blk, D, generator=g).bfloat16()
    return q, k, v


@needs_native
@pytest.mark.parametrize(
    "B,H,KV,D,nb,blk,lengths",
    [
        (1, 16, 4, 128, 2, 1024, [1500]),  # the benchmark's shape, a partial last block
        (3, 8, 2, 64, 3, 16, [40, 17, 1]),  # ragged, one sequence of a single position
        (2, 6, 6, 128, 1, 8, [8, 5]),  # MHA: one query head per K/V head
        (2, 12, 2, 64, 2, 32, [64, 33]),  # 6 query heads per K/V head: a partial group tile
        (1, 6, 2, 256, 2, 40, [70]),  # 3 per K/V head, head_dim 256, block not a multiple of 16
    ],
)
def test_attention_matches_fp32_reference(B, H, KV, D, nb, blk, lengths, variant):
    q, k, v = random_attention(B, H, KV, D, nb, blk)
    lens = torch.tensor(lengths)
    ref = attention_reference(q, k, v, lens)
    out = native.decode_attention(q, k, v, lens, **variant)
    assert out.shape == (B, H, 1, D) and out.dtype == torch.float32
    err = (out - ref).abs().max().item()
    assert err <= 2e-3
    valid = (torch.arange(nb * blk).view(1, -1) < lens.view(B, 1)).view(B, 1, 1, -1)
    torch_out = decode_attention(q, k, v, None, None, valid, 1 << 22).float()
    torch_err = (torch_out - ref).abs().max().item()
    assert err <= torch_err + 1e-6


@needs_native
@pytest.mark.parametrize(
    "B,H,KV,D,nb,blk,lengths",
    [
        (1, 16, 4, 128, 2, 1024, [1500]),
        (3, 8, 2, 64, 3, 16, [40, 17, 1]),
        (2, 12, 2, 64, 2, 32, [64, 33]),
    ],
)
def test_int8_attention_matches_the_dequantized_reference(B, H, KV, D, nb, blk, lengths, variant):
    """int8 K/V with one fp16 scale per (token, head): the kernel applies the scales to the
    scores and to p; the reference dequantizes K and V first. Same maths, fp32 either way."""
    q, k, v = random_attention(B, H, KV, D, nb, blk, seed=5)
    (k8, ks), (v8, vs) = quantize(k.float(), "int8"), quantize(v.float(), "int8")
    lens = torch.tensor(lengths)
    ref = attention_reference(q, k8.float() * ks.float(), v8.float() * vs.float(), lens)
    out = native.decode_attention(q, k8, v8, lens, ks, vs, **variant)
    err = (out - ref).abs().max().item()
    assert err <= 2e-3
    valid = (torch.arange(nb * blk).view(1, -1) < lens.view(B, 1)).view(B, 1, 1, -1)
    torch_out = decode_attention(q, k8, v8, ks, vs, valid, 1 << 22).float()
    assert err <= (torch_out - ref).abs().max().item() + 1e-6


@needs_native
def test_attention_ignores_positions_past_each_length(variant):
    blk = 16
    q, k, v = random_attention(2, 4, 2, 64, 2, blk)
    lens = torch.tensor([20, 7])
    before = native.decode_attention(q, k, v, lens, **variant)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(lens.tolist()):
        for pos in range(n, 2 * blk):  # stale positions: garbage that would dominate if read
            k2[pos // blk, b, :, pos % blk] = 5e3
            v2[pos // blk, b, :, pos % blk] = -5e3
    assert torch.equal(native.decode_attention(q, k2, v2, lens, **variant), before)


@needs_native
@pytest.mark.parametrize("M", [1, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("N,K", [(96, 256), (90, 64), (7, 32), (33, 6)])
def test_gemv_matches_torch_to_one_rounding(M, N, K, variant):
    g = gen(M * 1000 + N)
    w = (torch.randn(N, K, generator=g) / math.sqrt(K)).bfloat16()
    x = torch.randn(M, K, generator=g).bfloat16()
    exact = x.float() @ w.float().T
    out = native.gemv_bf16(x, native.pack_weight(w), N, **variant)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
    # batched leading dimensions come back in the caller's shape
    assert native.gemv_bf16(x.view(M, 1, K), native.pack_weight(w), N).shape == (M, 1, N)


@needs_native
def test_pack_unpack_roundtrip_and_padding():
    w = torch.randn(40, 64, generator=gen()).bfloat16()
    packed = native.pack_weight(w)
    assert packed.shape == (2, 32, 32, 2)  # 40 rows padded to 64, k in pairs
    assert torch.equal(packed[0, 5, 7], w[7, 10:12])  # group 0, k pair 5, row 7
    assert torch.equal(native.unpack_weight(packed, 40), w)
    padding = packed.permute(0, 2, 1, 3).reshape(64, 64)[40:]
    assert torch.equal(padding, torch.zeros(24, 64, dtype=torch.bfloat16))


def _zeros(*shape):
    return torch.zeros(*shape).bfloat16()


def _attention(*shape, lengths, scales=()):
    return native.decode_attention(*random_attention(*shape), torch.tensor(lengths), *scales)


def _int8_attention(lengths, *scales):
    q, k, v = (t.to(torch.int8) for t in random_attention(1, 4, 2, 64, 1, 8))
    return native.decode_attention(q, k, v, torch.tensor(lengths), *scales)


@needs_native
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: native.gemv_bf16(_zeros(1, 64), _zeros(4, 64), 4), "pack_weight"),
        (
            lambda: native.gemv_bf16(_zeros(1, 32), native.pack_weight(_zeros(4, 64)), 4),
            "32 features",
        ),
        (
            lambda: native.gemv_bf16(_zeros(1, 64), native.pack_weight(_zeros(4, 64)), 33),
            "pack_weight",
        ),
        (lambda: native.pack_weight(_zeros(4, 7)), "K even"),
        (lambda: _attention(1, 4, 2, 48, 1, 8, lengths=[8]), "head_dim % 64"),
        (lambda: _attention(1, 4, 2, 64, 1, 8, lengths=[9]), "lengths"),
        (lambda: _attention(1, 4, 2, 64, 1, 8, lengths=[0]), "lengths"),
        (lambda: _attention(2, 4, 2, 64, 1, 8, lengths=[3]), "shapes"),
        (
            lambda: _attention(
                1,
                4,
                2,
                64,
                1,
                8,
                lengths=[3],
                scales=(torch.ones(1, 1, 2, 8, 1).half(), torch.ones(1, 1, 2, 8, 1).half()),
            ),
            "int8",
        ),
        (lambda: _int8_attention([3], torch.ones(1, 1, 2, 8).half(), None), "scale"),
    ],
)
def test_bad_inputs_raise_instead_of_reading_wild_memory(call, match):
    with pytest.raises(KvlabError, match=match):
        call()


@needs_native
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_decoder_native_and_torch_kernels_agree(kv):
    """A bf16 decoder with head_dim 64: prefill, then decode steps through both kernel sets."""
    cfg = dict(config="small", weight_dtype="bf16")
    nat, ref = Decoder(**cfg, kernels="native"), Decoder(**cfg, kernels="torch")
    assert nat.kernels == "native" and ref.kernels == "torch"
    assert nat.streamed_weight_bytes() == ref.streamed_weight_bytes()
    tokens = torch.randint(0, 4096, (2, 40), generator=gen(3))
    logits = []
    for m in (nat, ref):
        cache = m.new_cache(2, 64, kv, block_tokens=16)
        out = [m.prefill(tokens[:, :30], cache, lengths=[30, 21])[:, 20]]
        for t in range(30, 40):
            out.append(m.decode(tokens[:, t], cache))
        logits.append(torch.stack(out, 1))
    rel = ((logits[0] - logits[1]).norm() / logits[1].norm()).item()
    assert rel < 0.02  # both bf16; they differ in rounding of p and of summation order


def test_kernels_choice_errors():
    with pytest.raises(KvlabError, match="kernels"):
        Decoder("tiny", "fp32", kernels="fast")
    with pytest.raises(KvlabError, match="CPU kernels"):
        Decoder("tiny", "fp32", device="meta", kernels="native")


def run_python(code, **env):
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300
    )


def test_disabled_native_falls_back_with_a_reason(tmp_path):
    code = (
        "from kvlab import native; from kvlab.decoder import Decoder\n"
        "print(native.status()); m = Decoder('tiny', 'bf16'); print(m.kernels)\n"
        "try:\n    Decoder('tiny', 'bf16', kernels='native')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = run_python(code, KVLAB_NATIVE="0", KVLAB_NATIVE_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "PyTorch kernels (disabled by KVLAB_NATIVE=0)"
    assert lines[1] == "torch"
    assert lines[2].startswith("KvlabError kernels 'native' asked for")
    assert "KVLAB_NATIVE=0" in lines[2]
    assert not list(tmp_path.iterdir())


def test_compiler_failure_is_one_clear_line(tmp_path):
    with pytest.raises(KvlabError, match=r"compiling kernels\.c with .* failed|no C compiler"):
        native.build(tmp_path, cc="false")
    # no half-written library left behind (the build's lock file stays, as lock files do)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@needs_native
def test_build_is_cached_and_atomic(tmp_path):
    first = native.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert native.build(tmp_path) == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    left = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")]
    assert left == [first.name]  # no temporaries left
    umask = os.umask(0o022)
    os.umask(umask)
    assert first.stat().st_mode & 0o777 == 0o777 & ~umask  # an ordinary library, not mkstemp's 0600
