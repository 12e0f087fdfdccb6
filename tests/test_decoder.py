"""The toy decoder: cached decoding is exact, placements agree, quantization stays close,
ragged batches work, and oversize caches fail before allocating. Tiny sizes, CPU.

Tolerances (fp32 weights and compute, logits of magnitude ~3):
- cached decode vs full recompute, fp32 KV: max |diff| <= 1e-4 (seen ~1.5e-6);
- host vs device placement: bit-identical (the same bytes reach the same kernels);
- KV quantization, relative L2 error of the logits: bf16 <= 1%, int8 <= 1%, fp8 <= 4%
  (seen 0.2%, 0.3%, 1.2%); int8 weights <= 3% (seen 1.1%).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvlab import native  # noqa: E402
from kvlab.bench.decode import make_step  # noqa: E402
from kvlab.cost import decode_step, kv_bytes_per_token, weight_read_bytes  # noqa: E402
from kvlab.decoder import (  # noqa: E402
    PRESETS,
    Decoder,
    DecoderConfig,
    fit,  # noqa: E402
    ledger,
)
from kvlab.decoder.config import get_config  # noqa: E402
from kvlab.decoder.kvcache import quantize  # noqa: E402
from kvlab.deployment import Deployment  # noqa: E402
from kvlab.errors import KvlabError  # noqa: E402

B, PROMPT, TOTAL, MAX_LEN = 3, 24, 40, 64
BLOCK = 16  # tokens per cache block: prompts and decodes cross block boundaries
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def model():
    return Decoder("tiny", "fp32")


@pytest.fixture(scope="module")
def tokens():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, PRESETS["tiny"].vocab_size, (B, TOTAL), generator=gen)


def generate(
    model, tokens, kv="fp32", placement="device", prefetch=False, block=BLOCK, max_len=MAX_LEN
):
    """Logits for positions PROMPT-1 .. TOTAL-1: prefill the prompt, then decode one by one."""
    cache = model.new_cache(tokens.shape[0], max_len, kv, placement, prefetch, block_tokens=block)
    out = [model.prefill(tokens[:, :PROMPT], cache)[:, -1]]
    for t in range(PROMPT, TOTAL):
        out.append(model.decode(tokens[:, t], cache))
    assert cache.lengths == [TOTAL] * tokens.shape[0]
    return torch.stack(out, 1)  # (B, steps, vocab)


@pytest.fixture(scope="module")
def reference(model, tokens):
    return generate(model, tokens)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_cached_decode_equals_full_recompute(tokens, kernel):
    m = Decoder("tiny", "fp32", prefill_kernel=kernel)
    full = m.prefill(tokens, m.new_cache(B, MAX_LEN, "fp32"))  # (B, TOTAL, vocab), no cache reuse
    cached = generate(m, tokens)
    assert full.abs().max() > 1  # the comparison is not between zeros
    assert (cached - full[:, PROMPT - 1 :]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("block", [1, 5, 16, 64])
def test_block_size_does_not_change_the_logits(model, tokens, reference, block):
    """Blocks only change where positions live; partial blocks are masked."""
    assert torch.allclose(generate(model, tokens, block=block), reference, atol=1e-5)


def test_decode_logits_depend_on_the_cached_history(model, tokens):
    """Sanity for the test above: a different history changes the next-token logits."""
    other = tokens.clone()
    other[:, 0] = (other[:, 0] + 1) % PRESETS["tiny"].vocab_size
    assert (generate(model, other)[:, -1] - generate(model, tokens)[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_host_placement_equals_device(model, tokens, kv, prefetch):
    device = generate(model, tokens, kv)
    host = generate(model, tokens, kv, "host", prefetch)
    assert torch.equal(host, device)


@pytest.mark.parametrize(
    "kv,tolerance", [("bf16", 0.01), ("fp16", 0.01), ("int8", 0.01), ("fp8", 0.04)]
)
def test_quantized_kv_stays_close(model, tokens, reference, kv, tolerance):
    err = rel_err(generate(model, tokens, kv), reference)
    assert 0 < err <= tolerance


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_chunked_dequantization_equals_one_pass(model, tokens, kv):
    """Quantized KV is dequantized a few blocks at a time; one block per chunk or all at
    once give the same logits."""

    def run(budget):
        cache = model.new_cache(B, MAX_LEN, kv, block_tokens=BLOCK, chunk_budget_bytes=budget)
        model.prefill(tokens[:, :PROMPT], cache)
        return torch.stack([model.decode(tokens[:, t], cache) for t in range(PROMPT, TOTAL)], 1)

    assert torch.allclose(run(1), run(1 << 30), atol=1e-5)


def test_int8_kv_is_closer_than_fp8(model, tokens, reference):
    int8 = rel_err(generate(model, tokens, "int8"), reference)
    assert int8 < rel_err(generate(model, tokens, "fp8"), reference)


def test_prepacked_bf16_weights_give_the_same_logits(tokens):
    plain = Decoder("tiny", "bf16", prepack=False, kernels="torch")
    packed = Decoder("tiny", "bf16", kernels="torch")
    if not packed.prepacked:
        pytest.skip("this torch build cannot prepack bf16 weights for oneDNN")
    assert packed.streamed_weight_bytes() == plain.streamed_weight_bytes()
    assert torch.equal(generate(packed, tokens, "bf16"), generate(plain, tokens, "bf16"))


def test_int8_weights_stay_close(tokens, reference):
    m = Decoder("tiny", "int8", compute_dtype="fp32")
    # the byte-per-weight kernel, not dequantize + matmul
    assert all(layer.wqkv.fused for layer in m.layers)
    assert 0 < rel_err(generate(m, tokens), reference) <= 0.03


def test_int8_weights_fallback_for_odd_widths(tokens):
    """Inner dimensions that are not multiples of 16 take the dequantize path, same numbers."""
    cfg = DecoderConfig(
        "odd",
        vocab_size=256,
        num_layers=1,
        hidden_size=40,
        num_heads=2,
        num_kv_heads=1,
        head_dim=20,
        intermediate_size=72,
    )
    m = Decoder(cfg, "int8", compute_dtype="fp32")
    assert not m.layers[0].wqkv.fused
    x = torch.randn(3, 40)
    lin = m.layers[0].wqkv
    expected = x @ (lin.weight.float() * lin.scale[:, None]).t()
    assert torch.allclose(lin(x), expected, atol=1e-5)


def test_quantize_roundtrip():
    x = torch.randn(5, 7, 64, generator=torch.Generator().manual_seed(0))
    x = x * torch.logspace(-4, 2, 7).view(1, 7, 1)
    x[0, 0] = 0.0  # a row of zeros must not divide by zero
    for kv, bound in (("int8", 0.5 / 127), ("fp8", 16 / 448)):
        q, s = quantize(x, kv)
        assert q.dtype != x.dtype and s.shape == (5, 7, 1)
        back = q.float() * s.float()
        assert torch.isfinite(back).all() and (back[0, 0] == 0).all()
        err = (back - x).abs().amax(-1)[1:] / x.abs().amax(-1)[1:]  # relative to each row's absmax
        # half a quantization step of the largest element; 10% more for the fp16 scale's own
        # rounding, which is coarse when the scale is subnormal (rows with absmax ~1e-4)
        assert err.max().item() <= bound * 1.10


@pytest.mark.parametrize("placement", ["device", "host"])
def test_ragged_batch_matches_each_sequence_alone(model, tokens, placement):
    lengths = [5, 17, 11]
    cache = model.new_cache(B, MAX_LEN, "fp32", placement, block_tokens=BLOCK)
    prompt = tokens[:, : max(lengths)]
    model.prefill(prompt, cache, lengths=lengths)
    assert cache.lengths == lengths
    nxt = torch.tensor([tokens[b, lengths[b]] for b in range(B)])
    batched = [model.decode(nxt, cache)]
    batched.append(model.decode(nxt.flip(0), cache))
    assert cache.lengths == [n + 2 for n in lengths]
    for b, n in enumerate(lengths):
        alone = model.new_cache(1, MAX_LEN, "fp32", placement, block_tokens=BLOCK)
        model.prefill(tokens[b : b + 1, :n], alone)
        first = model.decode(nxt[b : b + 1], alone)
        second = model.decode(nxt.flip(0)[b : b + 1], alone)
        assert torch.allclose(batched[0][b], first[0], atol=1e-4)
        assert torch.allclose(batched[1][b], second[0], atol=1e-4)


def test_oversize_cache_fails_up_front(model):
    # 2 layers x 2 x 2 heads x 16 x 4 bytes = 512 B/token: 100M tokens is 51 GB, more than this
    # machine
    huge = 100_000_000
    need = model.new_cache(1, 1, "fp32").bytes_per_token * huge
    if need < fit.host_available_bytes():
        pytest.skip("this machine has more free memory than the oversize request")
    with pytest.raises(KvlabError, match="needs .* but only .* free"):
        model.new_cache(1, huge, "fp32")


def test_oversize_device_cache_message(model, monkeypatch):
    monkeypatch.setattr(fit, "host_available_bytes", lambda: 1e6)
    with pytest.raises(KvlabError, match=r"KV cache \(2 x 4,096 tokens.*lower the batch"):
        model.new_cache(2, 4096, "fp32", "host")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kv_dtype="int4"), "unknown kv dtype"),
        (dict(placement="disk"), "unknown placement"),
        (dict(prefetch=True), "prefetch only applies"),
        (dict(max_seq_len=0), "max_seq_len"),
    ],
)
def test_bad_cache_arguments(model, kwargs, match):
    args = (
        dict(batch=1, max_seq_len=16, kv_dtype="fp32", placement="device", prefetch=False) | kwargs
    )
    with pytest.raises(KvlabError, match=match):
        model.new_cache(**args)


def test_overflowing_the_cache_is_an_error(model):
    cache = model.new_cache(1, 8, "fp32")
    model.prefill(torch.zeros(1, 8, dtype=torch.long), cache)
    with pytest.raises(KvlabError, match="exceed the cache's max_seq_len 8"):
        model.decode(torch.zeros(1, dtype=torch.long), cache)


def test_bad_config_and_tokens(model):
    with pytest.raises(KvlabError, match="multiple of num_kv_heads"):
        DecoderConfig(num_heads=6, num_kv_heads=4)
    with pytest.raises(KvlabError, match="unknown decoder preset"):
        get_config("huge")
    with pytest.raises(KvlabError, match="token ids"):
        model.prefill(torch.full((1, 3), 10_000), model.new_cache(1, 8, "fp32"))


def test_cache_limit_is_named(model):
    with pytest.raises(
        KvlabError, match="max_seq_len must be a whole number in 1..100,000,000, got 100000001"
    ):
        model.new_cache(1, 100_000_001, "fp32")


def test_cache_footprint_is_what_the_cache_allocates(model):
    from kvlab.decoder.kvcache import cache_footprint  # noqa: PLC0415 - torch loads only when used

    cases = (("fp32", "device", False), ("int8", "host", False), ("bf16", "host", True))
    for kv, placement, prefetch in cases:
        cache = model.new_cache(3, 40, kv, placement, prefetch, block_tokens=16)
        host, device = cache_footprint(
            model.config, 3, 40, kv, placement, "cpu", prefetch, block_tokens=16
        )
        assert (host, device) == (cache.nbytes, 0.0)  # on a CPU everything is host memory


# ------------------------------------------------------------------ matrix-product backends


def test_each_weight_gets_one_backend_chosen_once(tokens):
    from kvlab.decoder.linear import Int8Linear, NativeLinear, OneDNNLinear, TorchLinear  # noqa: PLC0415 - torch loads only when used

    def kinds(m):
        return {type(lin) for lin in m.linears()}

    assert kinds(Decoder("tiny", "fp32")) == {TorchLinear}
    assert kinds(Decoder("tiny", "int8", compute_dtype="fp32")) == {Int8Linear}
    assert kinds(Decoder("tiny", "bf16", prepack=False, kernels="torch")) == {TorchLinear}
    onednn = Decoder("tiny", "bf16", kernels="torch")
    assert kinds(onednn) in ({OneDNNLinear}, {TorchLinear}) and onednn.prepacked == sum(
        isinstance(lin, OneDNNLinear) for lin in onednn.linears()
    )
    if native.available():
        on_native = Decoder("tiny", "bf16", kernels="native")
        assert kinds(on_native) == {NativeLinear}
        assert on_native.decode_kernels("bf16")["weights"] == "native"
    # same seed, same weights through every backend: the logits agree
    plain = Decoder("tiny", "bf16", prepack=False, kernels="torch")
    assert torch.allclose(generate(onednn, tokens, "bf16"), generate(plain, tokens, "bf16"), atol=0)


def test_sdpa_prefill_without_enable_gqa_matches(tokens, monkeypatch):
    """torch < 2.5 has no `enable_gqa`: K and V are expanded to every query head instead."""
    from kvlab.decoder import attention  # noqa: PLC0415 - torch loads only when used

    m = Decoder("tiny", "fp32", prefill_kernel="sdpa")
    assert m.config.num_heads > m.config.num_kv_heads  # grouped-query: the guarded case
    reference = m.prefill(tokens, m.new_cache(B, MAX_LEN, "fp32"))
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa_before_2_5(*args, **kwargs):
        if "enable_gqa" in kwargs:
            raise TypeError(
                "scaled_dot_product_attention() got an unexpected keyword argument 'enable_gqa'"
            )
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_before_2_5)
    monkeypatch.setattr(attention, "SDPA_GQA", False)
    assert torch.allclose(m.prefill(tokens, m.new_cache(B, MAX_LEN, "fp32")), reference, atol=1e-5)
    monkeypatch.setattr(attention, "SDPA_GQA", True)  # what the guard prevents
    with pytest.raises(TypeError, match="enable_gqa"):
        m.prefill(tokens, m.new_cache(B, MAX_LEN, "fp32"))


@pytest.mark.parametrize(
    "version,expected",
    [
        ("2.3.1+cu121", False),
        ("2.4.0", False),
        ("2.5.0", True),
        ("2.11.0+cu130", True),
        ("3.0.0a0", True),
        ("weird", False),
    ],
)
def test_enable_gqa_needs_torch_2_5(monkeypatch, version, expected):
    from kvlab.decoder import attention  # noqa: PLC0415 - torch loads only when used

    monkeypatch.setattr(torch, "__version__", version)
    assert attention._torch_at_least(2, 5) is expected


# ------------------------------------------------------------------ CUDA calls, on stand-ins


def test_free_memory_is_asked_of_the_named_gpu(monkeypatch):
    """Before torch 2.5 `mem_get_info` refuses a device without an index; kvlab always
    passes a number: the one the device names, else the current device's."""
    asked = []

    def mem_get_info(index):
        if not isinstance(index, int):
            raise ValueError("Expected a torch.device with a specified index or an integer")
        asked.append(index)
        return 5e9, 8e9

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert fit.device_available_bytes("cuda:1") == 5e9 and fit.device_available_bytes("cuda") == 5e9
    assert asked == [1, 2]


class FakeStream:
    """A CUDA stream as a list of operations, each with the vector clock it was issued
    under: `seen[s]` is the last operation of stream s known to finish before it."""

    def __init__(self, name, device):
        self.name, self.device, self.ops, self.seen = name, device, [], {}

    def op(self, what):
        self.ops.append((what, dict(self.seen)))

    def frontier(self):
        return {**self.seen, self.name: len(self.ops) - 1}

    def _merge(self, clock):
        for stream, index in (clock or {}).items():
            self.seen[stream] = max(self.seen.get(stream, -1), index)

    def wait_event(self, event):
        self._merge(event.clock)

    def wait_stream(self, other):
        self._merge(other.frontier())


class FakeEvent:
    clock = None  # never recorded: waiting on it is a no-op, as in CUDA

    def record(self, stream):
        self.clock = stream.frontier()


class FakeCuda:
    """Stand-in for torch.cuda's Stream, Event, current_stream and stream; `tag` names what
    the next copies are (set by the test)."""

    def __init__(self, device):
        self.compute = FakeStream("compute", device)
        self.current, self.asked, self.tag = [self.compute], [], None

    def Stream(self, device):  # noqa: N802 - torch.cuda's name
        self.asked.append(device)
        return FakeStream("copy", device)

    def Event(self):  # noqa: N802
        return FakeEvent()

    def current_stream(self, device=None):
        self.asked.append(device)
        return self.current[-1]

    @__import__("contextlib").contextmanager
    def stream(self, s):
        self.current.append(s)
        s.op(self.tag)  # the copies issued inside the context
        yield
        self.current.pop()


def _after(streams, a, b) -> bool:
    """Whether op a = (stream, index) must finish before op b starts."""
    (sa, ia), (sb, ib) = a, b
    return (sa == sb and ia < ib) or streams[sb].ops[ib][1].get(sa, -1) >= ia


def test_prefetch_orders_copies_and_compute_with_events(tokens):
    """Host-placed KV with prefetch, on stand-in streams and events: every layer's attention
    waits for its history's copy, a slot is refilled only after the layer that used it
    before has finished, a pass's first copies wait for the previous pass, copies do overlap
    compute, and the numbers are those of device placement. Every stream is asked of the
    cache's device (cuda:1), never of the current one."""
    from kvlab.decoder.kvcache import _Streams  # noqa: PLC0415 - torch loads only when used

    cfg = DecoderConfig(
        "deep",
        vocab_size=256,
        num_layers=5,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
    )
    m = Decoder(cfg, "fp32")
    gpu = torch.device("cuda:1")
    fake = FakeCuda(gpu)
    cache = m.new_cache(B, MAX_LEN, "fp32", "host", prefetch=True, block_tokens=BLOCK)
    cache.streams = _Streams(gpu, 2, True, cuda=fake)
    passes = []
    begin, fetch, write, view = cache.begin, cache._fetch, cache.write, cache.view

    def tagged_begin(n_hist):
        passes.append(n_hist)
        begin(n_hist)

    def tagged_fetch(layer):
        fake.tag = ("fetch", len(passes) - 1, layer)
        fetch(layer)

    def use(layer):
        fake.current[-1].op(("use", len(passes) - 1, layer))

    cache.begin, cache._fetch = tagged_begin, tagged_fetch
    cache.write = lambda layer, *a: (use(layer), write(layer, *a))[1]
    cache.view = lambda layer, n: (use(layer), view(layer, n))[1]
    out = [m.prefill(tokens[:, :PROMPT], cache)[:, -1], m.decode(tokens[:, PROMPT], cache)]
    ref_cache = m.new_cache(B, MAX_LEN, "fp32", block_tokens=BLOCK)
    reference = [
        m.prefill(tokens[:, :PROMPT], ref_cache)[:, -1],
        m.decode(tokens[:, PROMPT], ref_cache),
    ]
    assert all(torch.equal(a, b) for a, b in zip(out, reference, strict=True))
    assert set(fake.asked) == {gpu}

    streams = {"compute": fake.compute, "copy": cache.streams.copy}
    fetches = {what[1:]: ("copy", i) for i, (what, _) in enumerate(streams["copy"].ops)}
    uses = [(what[1:], ("compute", i)) for i, (what, _) in enumerate(streams["compute"].ops)]
    every = [(p, lay) for p in (0, 1) for lay in range(cfg.num_layers)]
    assert len(passes) == 2 and sorted(fetches) == every
    assert all(what[0] == "fetch" for what, _ in streams["copy"].ops)
    for (p, layer), op in uses:  # attention reads a history that has arrived
        assert _after(streams, fetches[p, layer], op)
    for (p, layer), copy in fetches.items():
        if layer >= 2:  # the slot's previous occupant (layer - 2) has finished with it
            assert all(
                _after(streams, op, copy) for (q, lay), op in uses if (q, lay) == (p, layer - 2)
            )
        elif p > 0:  # a pass's first copies come after everything the previous pass queued
            assert all(_after(streams, op, copy) for (q, _), op in uses if q == p - 1)
    # copies overlap compute: layer 1's history is fetched without waiting for layer 0's attention
    assert not any(
        _after(streams, op, fetches[0, 1]) for (p, lay), op in uses if (p, lay) == (0, 0)
    )


# ------------------------------------------------------------------ the ledger mapping


@pytest.mark.parametrize("preset", ["tiny", "small", "cpu-bench", "gpu-bench", "mha-small"])
def test_spec_has_the_decoders_shapes(preset):
    c, spec = PRESETS[preset], ledger.model_spec(preset)
    shape = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim")
    assert [getattr(spec, k) for k in shape] == [getattr(c, k) for k in shape]
    assert not spec.tie_word_embeddings and spec.params.embedding == c.vocab_size * c.hidden_size


@pytest.mark.parametrize("weight_dtype,tolerance", [("fp32", 0), ("bf16", 0), ("int8", 0.005)])
def test_decoder_streams_the_weight_bytes_the_ledger_counts(weight_dtype, tolerance):
    m = Decoder("small", weight_dtype)
    counted = weight_read_bytes(
        ledger.model_spec("small"), 1, ledger.weight_ledger_dtype("small", weight_dtype)
    )
    assert m.streamed_weight_bytes() == pytest.approx(counted, rel=tolerance, abs=0)


@pytest.mark.parametrize("kv", ["fp32", "bf16", "fp16", "int8", "fp8"])
def test_cache_stores_the_kv_bytes_the_ledger_counts(model, kv):
    cache = model.new_cache(2, 40, kv, block_tokens=16)  # 3 blocks: 48 positions allocated
    counted = kv_bytes_per_token(ledger.model_spec("tiny"), ledger.kv_ledger_dtype("tiny", kv))
    assert cache.bytes_per_token == counted
    assert cache.capacity_tokens == 48 and cache.nbytes == cache.bytes_per_token * 2 * 48


def test_host_prediction_adds_the_fetch():
    dev = ledger.measured_device("test", 100e9, 1e12, 64e9)
    on_device = ledger.predict_decode("cpu-bench", dev, 8, 4096, "bf16", "bf16")
    serial = ledger.predict_decode("cpu-bench", dev, 8, 4096, "bf16", "bf16", "host", False, 10e9)
    overlapped = ledger.predict_decode(
        "cpu-bench", dev, 8, 4096, "bf16", "bf16", "host", True, 10e9
    )
    kv = 8 * 4096 * ledger.kv_bytes_per_token("cpu-bench", "bf16")
    assert serial["fetch_s"] == pytest.approx(kv / 10e9)
    assert serial["predicted_step_s"] == pytest.approx(on_device["predicted_step_s"] + kv / 10e9)
    expected = max(on_device["predicted_step_s"], kv / 10e9)
    assert overlapped["predicted_step_s"] == pytest.approx(expected)
    step = decode_step(Deployment(ledger.model_spec("cpu-bench"), dev, "bf16", "bf16"), 8, 4096)
    assert on_device["predicted_step_s"] == pytest.approx(step.step_time_s)


# ------------------------------------------------------------------ CUDA


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [False, True])
def test_cuda_host_placement_equals_device(tokens, prefetch):
    m = Decoder("tiny", "fp32", device="cuda")
    t = tokens.cuda()
    assert torch.equal(generate(m, t, "bf16", "host", prefetch), generate(m, t, "bf16"))
    assert torch.equal(generate(m, t, "int8", "host", prefetch), generate(m, t, "int8"))


@cuda
@pytest.mark.gpu
def test_cuda_matches_cpu(model, tokens, reference):
    m = Decoder("tiny", "fp32", device="cuda")
    # different random streams on CUDA: compare cached against full recompute instead
    full = m.prefill(tokens.cuda(), m.new_cache(B, MAX_LEN, "fp32"))
    assert (generate(m, tokens.cuda()) - full[:, PROMPT - 1 :]).abs().max().item() <= 1e-3


@cuda
@pytest.mark.gpu
def test_cuda_graph_step_equals_eager(tokens):
    m = Decoder("tiny", "bf16", device="cuda")
    cache = m.new_cache(B, MAX_LEN, "bf16")
    cache.fill_random_([32] * B)
    plan = m.plan(cache, [32] * B, 1)
    t = tokens[:, :1].cuda()
    eager = m.forward_plan(t, cache, plan).clone()
    fn, graphed = make_step(m, cache, plan, t, cuda_graph=True)
    assert graphed
    replayed = fn().clone()
    torch.cuda.synchronize()
    assert torch.isfinite(eager).all() and torch.allclose(replayed, eager, atol=1e-2, rtol=1e-2)


@cuda
@pytest.mark.gpu
def test_cuda_sdpa_prefill_matches_matmul(tokens):
    """The fused prefill (grouped-query SDPA, flash where it applies) against plain matmuls."""
    t = tokens.cuda()
    sdpa = Decoder("tiny", "fp32", device="cuda", prefill_kernel="sdpa")
    matmul = Decoder("tiny", "fp32", device="cuda", prefill_kernel="matmul")
    a = sdpa.prefill(t, sdpa.new_cache(B, MAX_LEN, "fp32"))
    b = matmul.prefill(t, matmul.new_cache(B, MAX_LEN, "fp32"))
    assert torch.allclose(a, b, atol=1e-3)


@cuda
@pytest.mark.gpu
def test_cuda_index_names_the_device_everywhere():
    """`cuda:0` spelled out: the cache's copy stream lives there, free memory is asked of it."""
    gpu = torch.device("cuda:0")
    m = Decoder("tiny", "fp32", device=gpu)
    cache = m.new_cache(B, MAX_LEN, "bf16", "host", prefetch=True)
    assert cache.streams.active and cache.streams.copy.device == gpu
    free, _ = torch.cuda.mem_get_info(0)
    assert 0 < fit.device_available_bytes(gpu) <= 1.01 * free
