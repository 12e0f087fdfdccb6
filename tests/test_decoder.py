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

from kvlab.cost import decode_step, kv_bytes_per_token, weight_read_bytes  # noqa: E402
from kvlab.decoder import Decoder, DecoderConfig, PRESETS, ledger  # noqa: E402
from kvlab.decoder import fit  # noqa: E402
from kvlab.decoder.config import get_config  # noqa: E402
from kvlab.decoder.kvcache import quantize  # noqa: E402
from kvlab.errors import KvlabError  # noqa: E402

B, PROMPT, TOTAL, MAX_LEN = 3, 24, 40, 64
BLOCK = 16  # tokens per cache block: prompts and decodes cross block boundaries
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def model():
    return Decoder("tiny", "fp32")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, PRESETS["tiny"].vocab_size, (B, TOTAL), generator=torch.Generator().manual_seed(1))


def generate(model, tokens, kv="fp32", placement="device", prefetch=False, block=BLOCK, max_len=MAX_LEN):
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
    assert (cached - full[:, PROMPT - 1:]).abs().max().item() <= 1e-4


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


@pytest.mark.parametrize("kv,tolerance", [("bf16", 0.01), ("fp16", 0.01), ("int8", 0.01), ("fp8", 0.04)])
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
    assert rel_err(generate(model, tokens, "int8"), reference) < rel_err(generate(model, tokens, "fp8"), reference)


def test_prepacked_bf16_weights_give_the_same_logits(tokens):
    plain = Decoder("tiny", "bf16", prepack=False, kernels="torch")
    packed = Decoder("tiny", "bf16", kernels="torch")
    if not packed.prepacked:
        pytest.skip("this torch build cannot prepack bf16 weights for oneDNN")
    assert packed.streamed_weight_bytes() == plain.streamed_weight_bytes()
    assert torch.equal(generate(packed, tokens, "bf16"), generate(plain, tokens, "bf16"))


def test_int8_weights_stay_close(tokens, reference):
    m = Decoder("tiny", "int8", compute_dtype="fp32")
    assert all(layer.wqkv.fused for layer in m.layers)  # the byte-per-weight kernel, not dequantize+matmul
    assert 0 < rel_err(generate(m, tokens), reference) <= 0.03


def test_int8_weights_fallback_for_odd_widths(tokens):
    """Inner dimensions that are not multiples of 16 take the dequantize path, same numbers."""
    cfg = DecoderConfig("odd", vocab_size=256, num_layers=1, hidden_size=40, num_heads=2, num_kv_heads=1,
                        head_dim=20, intermediate_size=72)
    m = Decoder(cfg, "int8", compute_dtype="fp32")
    assert not m.layers[0].wqkv.fused
    x = torch.randn(3, 40)
    lin = m.layers[0].wqkv
    expected = x @ (lin.weight.float() * lin.scale[:, None]).t()
    assert torch.allclose(lin(x), expected, atol=1e-5)


def test_quantize_roundtrip():
    x = torch.randn(5, 7, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-4, 2, 7).view(1, 7, 1)
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
    prompt = tokens[:, :max(lengths)]
    model.prefill(prompt, cache, lengths=lengths)
    assert cache.lengths == lengths
    nxt = torch.tensor([tokens[b, lengths[b]] for b in range(B)])
    batched = [model.decode(nxt, cache)]
    batched.append(model.decode(nxt.flip(0), cache))
    assert cache.lengths == [n + 2 for n in lengths]
    for b, n in enumerate(lengths):
        alone = model.new_cache(1, MAX_LEN, "fp32", placement, block_tokens=BLOCK)
        model.prefill(tokens[b:b + 1, :n], alone)
        first = model.decode(nxt[b:b + 1], alone)
        second = model.decode(nxt.flip(0)[b:b + 1], alone)
        assert torch.allclose(batched[0][b], first[0], atol=1e-4)
        assert torch.allclose(batched[1][b], second[0], atol=1e-4)


def test_oversize_cache_fails_up_front(model):
    # 2 layers x 2 x 2 heads x 16 x 4 bytes = 512 B/token: 100M tokens is 51 GB, more than this machine
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


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_dtype="int4"), "unknown kv dtype"),
    (dict(placement="disk"), "unknown placement"),
    (dict(prefetch=True), "prefetch only applies"),
    (dict(max_seq_len=0), "max_seq_len"),
])
def test_bad_cache_arguments(model, kwargs, match):
    args = dict(batch=1, max_seq_len=16, kv_dtype="fp32", placement="device", prefetch=False) | kwargs
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


# ------------------------------------------------------------------ the ledger mapping

@pytest.mark.parametrize("preset", ["tiny", "small", "cpu-bench", "gpu-bench", "mha-small"])
def test_spec_has_the_decoders_shapes(preset):
    c, spec = PRESETS[preset], ledger.model_spec(preset)
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == \
        (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim)
    assert not spec.tie_word_embeddings and spec.params.embedding == c.vocab_size * c.hidden_size


@pytest.mark.parametrize("weight_dtype,tolerance", [("fp32", 0), ("bf16", 0), ("int8", 0.005)])
def test_decoder_streams_the_weight_bytes_the_ledger_counts(weight_dtype, tolerance):
    m = Decoder("small", weight_dtype)
    counted = weight_read_bytes(ledger.model_spec("small"), 1, ledger.weight_ledger_dtype("small", weight_dtype))
    assert m.streamed_weight_bytes() == pytest.approx(counted, rel=tolerance, abs=0)


@pytest.mark.parametrize("kv", ["fp32", "bf16", "fp16", "int8", "fp8"])
def test_cache_stores_the_kv_bytes_the_ledger_counts(model, kv):
    cache = model.new_cache(2, 40, kv, block_tokens=16)  # 3 blocks: 48 positions allocated
    assert cache.bytes_per_token == kv_bytes_per_token(ledger.model_spec("tiny"), ledger.kv_ledger_dtype("tiny", kv))
    assert cache.capacity_tokens == 48 and cache.nbytes == cache.bytes_per_token * 2 * 48


def test_host_prediction_adds_the_fetch():
    dev = ledger.measured_device("test", 100e9, 1e12, 64e9)
    on_device = ledger.predict_decode("cpu-bench", dev, 8, 4096, "bf16", "bf16")
    serial = ledger.predict_decode("cpu-bench", dev, 8, 4096, "bf16", "bf16", "host", False, 10e9)
    overlapped = ledger.predict_decode("cpu-bench", dev, 8, 4096, "bf16", "bf16", "host", True, 10e9)
    kv = 8 * 4096 * ledger.kv_bytes_per_token("cpu-bench", "bf16")
    assert serial["fetch_s"] == pytest.approx(kv / 10e9)
    assert serial["predicted_step_s"] == pytest.approx(on_device["predicted_step_s"] + kv / 10e9)
    assert overlapped["predicted_step_s"] == pytest.approx(max(on_device["predicted_step_s"], kv / 10e9))
    step = decode_step(ledger.model_spec("cpu-bench"), dev, 8, 4096, "bf16", "bf16")
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
    assert (generate(m, tokens.cuda()) - full[:, PROMPT - 1:]).abs().max().item() <= 1e-3


@cuda
@pytest.mark.gpu
def test_cuda_graph_step_equals_eager(tokens):
    from kvlab.bench.decode import make_step

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
