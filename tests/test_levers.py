"""The two levers past the per-user ceiling: speculative decoding and tensor parallelism.

Hand-checked values, the behaviour each lever must show, and consistency between the
ledger's fast path, its per-operator path and the two levers combined.
"""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cost, speculative
from kvlab.cli import main
from kvlab.deployment import Deployment, KernelTables
from kvlab.errors import KvlabError
from kvlab.hardware import devices, gpu_link
from kvlab.kernel_tables import load
from kvlab.models import models
from kvlab.parallel import allreduce_link

MODELS = sorted(models())
H100 = "h100-sxm"
LLAMA_8B = Deployment("llama-3.1-8b", H100)


# ------------------------------------------------------------------ speculation


def test_acceptance_formula_by_hand():
    """(1 - A^(K+1)) / (1 - A): 1 + 0.8 + 0.64 + 0.512 + 0.4096 for A = 0.8, K = 4."""
    assert speculative.tokens_per_verify_step(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert speculative.tokens_per_verify_step(1.0, 4) == 5.0  # every draft accepted
    assert speculative.tokens_per_verify_step(0.0, 4) == 1.0  # the verify pass's own token
    grid = speculative.tokens_per_verify_step([0.8, 1.0, 0.0], 4)
    np.testing.assert_allclose(grid, [3.3616, 5.0, 1.0], rtol=1e-12)
    with pytest.raises(KvlabError, match="acceptance must be <= 1"):
        speculative.tokens_per_verify_step(1.2, 4)


@settings(max_examples=100, deadline=None)
@given(a=st.floats(0, 1), k=st.integers(0, 16))
def test_tokens_per_verify_step_lies_between_one_and_k_plus_one(a, k):
    tau = speculative.tokens_per_verify_step(a, k)
    assert 1.0 - 1e-12 <= tau <= k + 1 + 1e-12
    assert speculative.tokens_per_verify_step(min(a + 0.01, 1.0), k) >= tau - 1e-12
    assert speculative.tokens_per_verify_step(a, min(k + 1, 16)) >= tau - 1e-12


def test_verify_step_by_hand():
    """Llama 3.1 8B, batch 16, 4K context, K = 4: weights and KV history read once, five
    new K/V entries per sequence, GEMM FLOPs for 5 x 16 rows, attention for 5 queries
    against the history plus the 1 + 2 + 3 + 4 + 5 new positions up to and including
    each (a causal mask: each attends to itself)."""
    m = models()["llama-3.1-8b"]
    plain = cost.decode_step(LLAMA_8B, 16, 4096)
    v = cost.verify_step(LLAMA_8B, 16, 4096, speculative_tokens=4)
    assert v.weight_read_bytes == pytest.approx(plain.weight_read_bytes, rel=1e-12)
    assert v.kv_read_bytes == plain.kv_read_bytes
    assert v.kv_write_bytes == 5 * plain.kv_write_bytes
    active = m.params.active_per_token(m.experts_per_token)
    flops = 16 * (2 * active * 5 + m.attention_flops_per_cached_token * (5 * 4096 + 15))
    assert v.flops == pytest.approx(flops, rel=1e-12)
    assert v.bound == plain.bound == "memory"
    # memory-bound: one verify pass costs about one decode step (the extra KV writes)
    assert plain.step_time_s < v.step_time_s < 1.001 * plain.step_time_s


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    device=st.sampled_from(sorted(devices())),
    batch=st.integers(1, 4096),
    context=st.integers(0, 200_000),
)
def test_the_operator_path_is_the_fast_ledger(model, device, batch, context):
    """A verify step with K = 0 taken through the array path (an array K sends it there)
    equals the scalar decode step, field by field."""
    d = Deployment(model, device, "bf16", "fp8")
    fast = cost.decode_step(d, batch, context)
    slow = cost.verify_step(d, batch, context, np.array([0]))
    assert isinstance(slow.step_time_s, np.ndarray)  # it did take the other path
    for key, value in fast.to_dict().items():
        other = slow.to_dict()[key]
        other = other[0] if isinstance(other, list) and key != "notes" else other
        if isinstance(value, float):
            assert other == pytest.approx(value, rel=1e-12, abs=1e-300), key
        else:
            assert other == value, key


def test_speculation_pays_less_at_large_batch():
    """Llama 3.1 8B on an H100, 512-token contexts, K = 4, A = 0.7, self-drafting: about
    2x at small batch; once the verify pass's GEMMs (batch x 5 rows) pass the ridge the
    speedup falls with the batch and crosses 1, at the batch breakeven_batch finds."""
    batches = np.array([1, 64, 128, 256, 512])
    s = speculative.speculative_step(LLAMA_8B, batches, 512, 4, 0.7)
    speedup = np.asarray(s.speculative_speedup)
    assert speedup[0] > 1.9
    assert np.all(np.diff(speedup) < 0)
    assert speedup[-1] < 1.0
    knee = speculative.breakeven_batch(LLAMA_8B, 512, 4, 0.7)
    at = speculative.speculative_step(LLAMA_8B, [knee - 1, knee], 512, 4, 0.7)
    assert at.speculative_speedup[0] > 1.0 >= at.speculative_speedup[1]
    assert 128 < knee < 512
    assert np.asarray(s.verify_bound)[-1] == "compute"


def test_speculation_keeps_paying_where_long_contexts_make_the_step_kv_bound():
    """At 32K tokens the KV history, read once by both passes, dominates: the speedup
    rises with the batch and never falls to 1 (MagicDec's observation)."""
    s = speculative.speculative_step(LLAMA_8B, [1, 64, 1024], 32768, 4, 0.7)
    assert s.speculative_speedup[1] > s.speculative_speedup[0] > 1.5
    assert speculative.breakeven_batch(LLAMA_8B, 32768, 4, 0.7) is None


def test_a_speculation_round_adds_up():
    """cycle = verify + K drafts; tokens/s = batch x tau / cycle; speedup against the plain
    decode step of the same settings; a draft model's steps are its own ledger."""
    d = Deployment("llama-3.1-70b", "h200", "fp8")
    s = speculative.speculative_step(d, 8, 4096, 3, 0.6, "llama-3.1-8b")
    plain = cost.decode_step(d, 8, 4096)
    verify = cost.verify_step(d, 8, 4096, 3)
    draft = cost.decode_step(d.replace(model="llama-3.1-8b"), 8, 4096)
    tau = 1 + 0.6 + 0.36 + 0.216
    assert s.tokens_per_verify_step == pytest.approx(tau)
    assert s.verify_step_time_s == verify.step_time_s
    assert s.draft_time_s == pytest.approx(3 * draft.step_time_s, rel=1e-12)
    assert s.cycle_time_s == pytest.approx(verify.step_time_s + 3 * draft.step_time_s)
    assert s.tokens_per_s == pytest.approx(8 * tau / s.cycle_time_s)
    assert s.tokens_per_s == pytest.approx(8 * s.tokens_per_s_per_sequence)
    assert s.speculative_speedup == pytest.approx(tau * plain.step_time_s / s.cycle_time_s)
    assert s.memory_needed_bytes > plain.memory_needed_bytes + draft.weight_bytes
    assert s.fits and 0 < s.max_batch < plain.max_batch


def test_self_drafting_costs_one_layer_and_the_lm_head():
    """Batch 1, every operator memory-bound: one drafted token moves 1/32 of Llama 3.1 8B's
    per-layer bytes plus its whole LM head (128,256 x 4,096 x 2 bytes)."""
    s = speculative.speculative_step(LLAMA_8B, 1, 4096, 4, 0.7)
    plain = cost.decode_step(LLAMA_8B, 1, 4096)
    head = 128256 * 4096 * 2
    expected = ((plain.step_bytes - head) / 32 + head) / 3.35e12
    assert s.draft_step_time_s == pytest.approx(expected, rel=1e-6)
    assert "LM head" in s.draft and s.draft_model is None


def test_a_draft_must_share_the_vocabulary():
    with pytest.raises(KvlabError, match="vocabulary"):
        speculative.speculative_step(LLAMA_8B, 1, 4096, 4, 0.7, "qwen2.5-7b")


def test_measured_speculation_times_the_verify_pass_from_the_tables():
    measured = LLAMA_8B.replace(speed=KernelTables())
    s = speculative.speculative_step(measured, 16, 4096, 4, 0.7)
    ceiling = cost.verify_step(LLAMA_8B, 16, 4096, 4)
    plain = cost.decode_step(measured, 16, 4096)
    assert s.verify_step_time_s > ceiling.step_time_s
    assert s.verify_step_time_s > plain.step_time_s
    assert "TRTLLM" in s.efficiency_source
    assert any("one-query measurement scaled" in note for note in s.notes)
    assert 1.5 < s.speculative_speedup < s.tokens_per_verify_step


# ------------------------------------------------------------ tensor parallelism


def test_the_catalogue_names_each_devices_gpu_link():
    links = {name: gpu_link(name).name for name in devices()}
    assert links["h100-sxm"] == links["h200"] == "nvlink4"
    assert links["a100-80gb"] == "nvlink3" and links["b200"] == "nvlink5"
    assert {links[d] for d in ("l40s", "l4", "rtx-4090", "rtx-3090")} == {"pcie4-x16"}
    assert gpu_link("b200").bandwidth_bytes_per_s == 900e9
    assert gpu_link("a100-80gb").bandwidth_bytes_per_s == 300e9
    with pytest.raises(KvlabError, match="mi300x: no measured all-reduce latency"):
        cost.decode_step(Deployment("llama-3.1-8b", "mi300x", tensor_parallel=2))


def test_allreduce_latency_is_the_measured_smallest_message():
    """H100, 8 GPUs: TensorRT-LLM's all-reduce of 128 elements, 3.2298 us; an L4 (PCIe, no
    tables of its own) takes the L40S's PCIe measurement."""
    link = allreduce_link(H100, 8)
    assert link.latency_s == pytest.approx(3.2298e-6)
    assert link.bandwidth_bytes_per_s == 450e9
    assert allreduce_link("l4", 4).latency_s == load("l40s").all_reduce(4).y[0]


def test_llama_70b_in_bf16_fits_no_single_h100_and_fits_on_eight():
    d = Deployment("llama-3.1-70b", H100, "bf16", "bf16")
    one = cost.decode_step(d, 1, 4096)
    eight = cost.decode_step(d.replace(tensor_parallel=8), 1, 4096)
    assert not one.fits and one.max_batch == 0 and one.weight_bytes > 80e9
    assert eight.fits and eight.max_batch > 300
    norms = (2 * 8192 * 80 + 8192) * 2  # RMSNorm weights: whole on every GPU
    assert eight.weight_bytes == one.weight_bytes / 8 + norms * 7 / 8
    assert eight.kv_bytes_per_token == one.kv_bytes_per_token / 8  # 8 K/V heads, one each
    assert eight.capacity_bytes == 0.9 * 80e9  # per GPU: 90% of its 80 GB is usable
    assert any("per GPU" in note for note in eight.notes)


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_allreduce_makes_tp8_slower_than_an_eighth_of_tp1(batch):
    """Llama 3.1 8B fits on one H100. Split over eight, each GPU moves an eighth of the
    bytes, but the step also waits for 64 all-reduces: it takes more than 1/8 of TP1's."""
    one = cost.decode_step(LLAMA_8B, batch, 4096)
    eight = cost.decode_step(LLAMA_8B.replace(tensor_parallel=8), batch, 4096)
    assert eight.step_time_s > one.step_time_s / 8 + 64 * 3.2e-6
    assert eight.step_time_s - eight.allreduce_time_s >= one.step_time_s / 8 * (1 - 1e-9)
    assert eight.tokens_per_s < 8 * one.tokens_per_s
    assert eight.tokens_per_s_per_sequence > one.tokens_per_s_per_sequence


def test_allreduce_latency_not_bandwidth_limits_small_batches():
    """Llama 3.1 70B, TP8 on H100: 160 all-reduces of batch x 8,192 bf16 values. At batch 1
    each moves 1.75 x 16 kB over 450 GB/s (64 ns) but pays 3.23 us; the link time only
    catches up with the latency at a few dozen sequences."""
    b = np.array([1, 8, 64, 512])
    d = Deployment("llama-3.1-70b", H100, tensor_parallel=8)
    s = cost.decode_step(d, b, 4096)
    latency = np.asarray(s.allreduce_latency_s)
    link = np.asarray(s.allreduce_time_s) - latency
    np.testing.assert_allclose(latency, 160 * 3.2298e-6, rtol=1e-12)
    np.testing.assert_allclose(link, 160 * 1.75 * b * 8192 * 2 / 450e9, rtol=1e-12)
    assert latency[0] > 50 * link[0]
    assert link[-1] > latency[-1]
    measured = cost.decode_step(d.replace(speed=KernelTables()), 1, 4096)
    # the table's all-reduce of 8,192 elements (batch 1): 3.5587 us, 160 times
    assert measured.allreduce_time_s == pytest.approx(160 * 3.5587e-6, rel=1e-9)
    assert measured.allreduce_latency_s / measured.allreduce_time_s > 0.9


def test_replicated_kv_heads_are_said_and_counted():
    """Two K/V heads over eight GPUs: each GPU holds one (replicated four times), so its KV
    is half the model's, not an eighth."""
    m = dataclasses.replace(models()["llama-3.1-8b"], num_kv_heads=2, name="two-kv-heads")
    one = cost.decode_step(Deployment(m, H100), 4, 4096)
    eight = cost.decode_step(Deployment(m, H100, tensor_parallel=8), 4, 4096)
    assert eight.kv_bytes_per_token == one.kv_bytes_per_token / 2
    assert any("replicated on 4 GPUs" in note for note in eight.notes)
    mla = cost.decode_step(Deployment("deepseek-v3", "h200", "fp8", tensor_parallel=8), 1, 4096)
    assert mla.kv_bytes_per_token == cost.kv_bytes_per_token("deepseek-v3")
    assert any("MLA latent" in note for note in mla.notes)


def test_mla_projections_split_over_tensor_parallel_with_the_down_projections_replicated():
    """DeepSeek-V3's attention projections at TP8: the up- and output projections split
    eight ways, the down-projections into the latents (hidden x (1536 + 512 + 64) per
    layer) stay whole on every GPU (vLLM's ReplicatedLinear). A regression: they once
    counted zero bytes at any TP above 1."""
    m = models()["deepseek-v3"]

    def deployment(tp):
        return Deployment(m, "h200", "fp8", "bf16", tensor_parallel=tp)

    def proj_bytes(tp):
        ops = deployment(tp).table.operators
        return next(op.weight_bytes for op in ops if op.name == "attention_proj")

    replicated = m.num_layers * (7168 * (1536 + 512 + 64) + 1536 + 512)
    assert proj_bytes(8) == pytest.approx(replicated + (proj_bytes(1) - replicated) / 8)
    assert proj_bytes(1) / 8 < proj_bytes(8) < proj_bytes(1) / 2
    one = cost.decode_step(deployment(1), 1, 4096)
    eight = cost.decode_step(deployment(8), 1, 4096)
    assert one.weight_bytes / 8 < eight.weight_bytes < one.weight_bytes / 7


def test_tensor_parallel_prefill_and_memory_fit_are_per_gpu():
    tp8 = LLAMA_8B.replace(tensor_parallel=8)
    one = cost.prefill(LLAMA_8B, 4096)
    eight = cost.prefill(tp8, 4096)
    assert eight.flops == pytest.approx(one.flops / 8, rel=1e-3)
    assert one.time_s / 8 < eight.time_s < one.time_s
    hit = cost.prefill(tp8, 4096, 4096)
    assert hit.computed_tokens == 1 and 0 < hit.time_s < eight.time_s / 20  # the last token
    fit1 = cost.memory_fit(Deployment("llama-3.1-70b", H100, "fp8"), 8, 8192)
    fit4 = cost.memory_fit(Deployment("llama-3.1-70b", H100, "fp8", tensor_parallel=4), 8, 8192)
    assert fit4.max_batch > 4 * fit1.max_batch and fit4.max_context > 4 * fit1.max_context


@pytest.mark.parametrize("bad", [3, 16, 2.5, "8", True])
def test_bad_tensor_parallel_degrees_raise(bad):
    with pytest.raises(KvlabError, match="tensor"):
        Deployment("llama-3.1-8b", H100, tensor_parallel=bad)
    with pytest.raises(KvlabError, match="do not split over 8"):
        Deployment("qwen2.5-7b", H100, tensor_parallel=8)


# ---------------------------------------------------------------- the two at once


def test_tensor_parallel_and_speculation_combine_consistently():
    """Llama 3.1 70B on eight H100s, K = 4: the round's baseline and verify pass are the TP8
    ledger's; the verify pass's all-reduces carry five times the rows (same latency, five
    times the link time); the self-drafting head pays two all-reduces per drafted token."""
    d = Deployment("llama-3.1-70b", H100, tensor_parallel=8)
    s = speculative.speculative_step(d, 16, 4096, 4, 0.7)
    plain = cost.decode_step(d, 16, 4096)
    verify = cost.verify_step(d, 16, 4096, 4)
    assert s.tensor_parallel == 8 and s.baseline_step_time_s == plain.step_time_s
    assert s.verify_step_time_s == verify.step_time_s
    assert verify.allreduce_latency_s == plain.allreduce_latency_s
    link = verify.allreduce_time_s - verify.allreduce_latency_s
    assert link == pytest.approx(5 * (plain.allreduce_time_s - plain.allreduce_latency_s))
    assert s.draft_step_time_s > 2 * allreduce_link(H100, 8).latency_s
    assert s.fits and 1.5 < s.speculative_speedup < s.tokens_per_verify_step
    draft = speculative.speculative_step(d, 16, 4096, 4, 0.7, "llama-3.1-8b")
    small = cost.decode_step(d.replace(model="llama-3.1-8b"), 16, 4096)
    assert draft.draft_step_time_s == small.step_time_s
    assert draft.speculative_speedup < s.speculative_speedup  # a whole model drafts dearer


# ------------------------------------------------------------------------- CLI


def test_budget_json_adds_the_levers_and_keeps_the_defaults(capsys):
    assert main(["budget", "--model", "llama-3.1-8b", "--batch", "16", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["tensor_parallel"] == 1 and plain["allreduce_time_s"] == 0
    assert plain["tokens_per_verify_step"] == 1 and plain["speculative_speedup"] == 1
    assert plain["speculative"] is None
    assert plain["step_time_s"] == cost.decode_step(LLAMA_8B, 16, 4096).step_time_s
    code = main(
        [
            "budget",
            "--model",
            "llama-3.1-70b",
            "--batch",
            "16",
            "--tensor-parallel",
            "8",
            "--speculative-tokens",
            "4",
            "--acceptance",
            "0.8",
            "--json",
        ]
    )
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["tensor_parallel"] == 8 and r["fits"]
    assert r["allreduce_time_s"] > r["allreduce_latency_s"] > 0
    assert r["tokens_per_verify_step"] == pytest.approx(3.3616)
    assert r["speculative_speedup"] == r["speculative"]["speculative_speedup"] > 1
    assert r["speculative_breakeven_batch"] is None or r["speculative_breakeven_batch"] > 16
    assert {row["name"] for row in r["speculative"]["operators"]} >= {"attention", "all_reduce"}
    assert any("tensor parallel 8" in note for note in r["notes"])


def test_budget_tables_show_the_levers(capsys):
    code = main(
        [
            "budget",
            "--model",
            "llama-3.1-70b",
            "--tensor-parallel",
            "8",
            "--speculative-tokens",
            "4",
            "--acceptance",
            "0.7",
            "--draft-model",
            "llama-3.1-8b",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "tensor parallel" in out and "all-reduces take" in out
    assert "4 x" in out and "(llama-3.1-8b)" in out and "x plain decode" in out
    assert "operators of one verify pass" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculative-tokens", "4"], "needs --acceptance"),
        (["--acceptance", "0.7"], "need --speculative-tokens"),
        (["--speculative-tokens", "4", "--acceptance", "1.5"], "acceptance must be <= 1"),
        (["--tensor-parallel", "3"], "must be one of (1, 2, 4, 8)"),
        (
            ["--speculative-tokens", "4", "--acceptance", "0.5", "--draft-model", "gpt-9"],
            "unknown model 'gpt-9'",
        ),
    ],
)
def test_budget_lever_errors_exit_2(capsys, argv, message):
    code = main(["budget", "--model", "llama-3.1-8b", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
