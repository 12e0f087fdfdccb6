"""Five-step diagnosis: verdicts follow the article's thresholds, numbers come from the ledger."""

import json

import pytest

from kvlab import cost, fmt, hardware, tiers
from kvlab import diagnose as module
from kvlab.cli import main
from kvlab.deployment import Deployment
from kvlab.diagnose import diagnose
from kvlab.errors import KvlabError
from kvlab.tiers import tiered_decode_step

LLAMA_8B = Deployment("llama-3.1-8b", "h100-sxm")


def ceiling(**kw):
    return cost.decode_step(LLAMA_8B, **kw).tokens_per_s


def test_near_the_ceiling_is_bandwidth_bound_and_says_cut_bytes():
    d = diagnose("llama-3.1-8b", "h100-sxm", 8, 16384, 0.9 * ceiling(batch=8, context=16384))
    assert d.bound == "memory bandwidth"
    one, two, three = d.findings[:3]
    assert one.numbers["utilisation"] == pytest.approx(0.9)
    assert two.numbers["fraction_of_ceiling"] == pytest.approx(0.9)
    assert "stop tuning the scheduler" in two.advice[0]
    assert three.numbers["kv_share"] > 0.5 and "fp8" in three.advice[0]  # KV dominates at 16K x 8


def test_short_context_small_batch_points_at_weights_and_the_knee():
    d = diagnose("llama-3.1-8b", "h100-sxm", 1, 1024, 0.85 * ceiling(batch=1, context=1024))
    three = d.findings[2]
    assert three.numbers["kv_share"] < 0.1
    assert any("int4" in a for a in three.advice)
    assert any("raise the batch" in a for a in three.advice)


def test_low_utilisation_blames_overheads():
    d = diagnose("llama-3.1-8b", "h100-sxm", 8, 4096, 0.2 * ceiling(batch=8, context=4096))
    assert d.bound == "overheads"
    assert "elsewhere" in d.findings[0].verdict


def test_kv_in_host_memory_is_found():
    d = diagnose("llama-3.1-8b", "h100-sxm", 8, 16384, 30, kv_tier="host-pcie5")
    four = d.findings[3]
    assert four.numbers["slowdown"] > 10 and d.bound == "KV tier"


def test_network_transfer_in_decode_steps():
    step = cost.decode_step(LLAMA_8B, 8, 4096)
    d = diagnose(
        "llama-3.1-8b",
        "h100-sxm",
        8,
        4096,
        step.tokens_per_s,
        network_bandwidth_bytes_per_s="ib-200g",
        kv_bytes_per_request=4096 * 131072,
    )
    five = d.findings[4]
    assert five.numbers["transfer_s"] == pytest.approx(4096 * 131072 / 25e9)
    assert five.numbers["transfer_in_decode_steps"] == pytest.approx(
        five.numbers["transfer_s"] / step.step_time_s
    )


def test_a_measurement_above_the_ceiling_is_questioned():
    d = diagnose("llama-3.1-8b", "h100-sxm", 1, 4096, 3 * ceiling(batch=1, context=4096))
    assert "above" in d.findings[1].verdict and "check the dtypes" in d.findings[1].advice[0]


def test_cli_json_and_bad_input(capsys):
    assert main(["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [f["step"] for f in out["findings"]] == [1, 2, 3, 4, 5]
    assert main(["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "0"]) == 2
    assert "tokens/s must be > 0" in capsys.readouterr().err
    with pytest.raises(KvlabError, match="placement"):
        diagnose("llama-3.1-8b", "h100-sxm", 1, 4096, 100, kv_tier="moon")


# ------------------------------------------------------------------ fit first, every input checked


def test_a_deployment_that_does_not_fit_is_said_so_before_any_advice(capsys):
    """70B in fp16 on a 24 GB L4: 141 GB of weights. The first thing the diagnosis says is
    that it cannot run; its bound is memory capacity."""
    d = diagnose("llama-3.1-70b", "l4", 1, 4096, 10)
    assert not d.fits and d.bound == "memory capacity"
    assert d.fit.numbers["needed_bytes"] > d.fit.numbers["capacity_bytes"] == 0.9 * 24e9
    lines = d.report().splitlines()
    first = next(i for i, text in enumerate(lines) if text.lstrip().startswith("- "))
    assert lines[2].startswith("0. memory fit: does NOT fit") and first == 3
    assert "nothing fits on one l4" in lines[3]
    argv = ["diagnose", "--model", "llama-3.1-70b", "--hardware", "l4", "--tokens-per-s", "10"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["bound"] == "memory capacity" and out["fit"]["step"] == 0


def test_weights_too_big_for_one_device_get_only_advice_that_fits():
    """70B on an L4 (21.6 GB usable): int4 weights (35.3 GB) still do not fit, so int4 is not
    advised; the advice is the smallest tensor-parallel degree that fits, and the catalogue
    devices that hold it as it is."""
    m, usable = "llama-3.1-70b", 0.9 * 24e9
    d = diagnose(m, "l4", 1, 4096, 1)
    int4 = cost.decode_step(Deployment(m, "l4", "int4"), 1, 4096)
    assert not int4.fits and int4.memory_needed_bytes > usable
    first, split, bigger = d.fit.advice
    assert first.startswith("nothing fits on one l4: even with int4 weights (35.3 GB)")
    assert fmt.si(int4.memory_needed_bytes, "B") in first
    on = {n: Deployment(m, "l4", tensor_parallel=n) for n in (2, 4, 8)}
    fits = {n: cost.decode_step(d, 1, 4096).fits for n, d in on.items()}
    assert fits == {2: False, 4: False, 8: True}
    per_gpu = cost.decode_step(on[8], 1, 4096).memory_needed_bytes
    assert split == (
        f"split the model over 8 l4 GPUs with tensor parallelism: each holds "
        f"{fmt.si(per_gpu, 'B')} of its 21.6 GB"
    )
    named = bigger.split(": ")[1].removesuffix(" (kvlab hardware)").split(", ")
    for name in hardware.devices():
        holds = cost.decode_step(Deployment(m, name), 1, 4096).fits
        assert (name in named) == holds, name
    assert "quantize the weights to int4" not in d.report()  # step 3 does not advise it either


def test_weights_that_fit_once_quantized_name_the_widest_dtype_that_does():
    d = diagnose("llama-3.1-70b", "h100-sxm", 1, 4096, 10)
    int8 = cost.decode_step(Deployment("llama-3.1-70b", "h100-sxm", "int8"), 1, 4096)
    assert int8.fits
    needed = fmt.si(int8.memory_needed_bytes, "B")
    assert d.fit.advice == [
        f"the weights alone exceed the memory: quantized to int8 they take "
        f"{fmt.si(int8.weight_bytes, 'B')}, and with the KV {needed} of the 72.0 GB: that fits"
    ]


def test_kv_too_big_even_for_a_server_says_so():
    d = diagnose("llama-3.1-70b", "rtx-3090", 64, 102400, 1)
    assert any(a.startswith("not even 8 rtx-3090 GPUs") for a in d.fit.advice)
    assert d.fit.advice[-1].startswith("the KV alone (2.15 TB) exceeds the memory")


def test_the_knee_that_does_not_fit_becomes_the_largest_batch_that_does():
    d = diagnose("llama-3.1-8b", "l4", 1, 4096, 10)
    l4 = Deployment("llama-3.1-8b", "l4")
    step = cost.decode_step(l4, 1, 4096)
    most = cost.decode_step(l4, step.max_batch, 4096)
    assert most.fits and not cost.decode_step(l4, 32, 4096).fits
    assert (
        f"raise the batch to {step.max_batch}, the most that fits (the knee at 32 does not): "
        f"{fmt.rate(most.tokens_per_s)} tokens/s" in d.findings[2].advice[1]
    )


def test_kv_in_host_memory_is_advised_at_the_tier_it_is_read_from():
    """Book chapter 5's host-memory case: the step is paced by PCIe (28.9 tokens/s); fp8 KV
    halves what crosses PCIe (~57 tokens/s), not the HBM ceiling (1,136)."""
    args = ("llama-3.1-8b", "h100-sxm", 8, 16384)
    fp8_kv = Deployment("llama-3.1-8b", "h100-sxm", "fp16", "fp8")
    host = tiers.tiered_decode_step(LLAMA_8B, 8, 16384, "host-pcie5")
    fp8 = tiers.tiered_decode_step(fp8_kv, 8, 16384, "host-pcie5")
    hbm_fp8 = cost.decode_step(fp8_kv, 8, 16384)
    d = diagnose(*args, 0.9 * host.tokens_per_s, kv_tier="host-pcie5")
    three = d.findings[2]
    assert three.numbers["kv_time_share"] > 0.95  # 53% of the bytes, 98% of the time
    assert three.advice[0] == (
        f"quantize the KV cache to fp8: ceiling {fmt.rate(fp8.tokens_per_s)} tokens/s with the KV "
        f"still read from host-pcie5 ({fmt.sig(fp8.tokens_per_s / host.tokens_per_s, 3)}x)"
    )
    assert 1.9 < fp8.tokens_per_s / host.tokens_per_s < 2.0
    assert fmt.rate(hbm_fp8.tokens_per_s) not in d.report()
    assert three.advice[1].startswith("a larger batch does not help while the KV is read from")
    # weights dominate at batch 1 even over PCIe: the batch helps until PCIe paces the step
    d1 = diagnose("llama-3.1-8b", "h100-sxm", 1, 1024, 50, kv_tier="host-pcie5")
    knee = d1.findings[2].numbers["tier_knee_batch"]
    paced = tiers.tiered_decode_step(LLAMA_8B, knee, 1024, "host-pcie5")
    before = tiers.tiered_decode_step(LLAMA_8B, knee / 2, 1024, "host-pcie5")
    assert paced.bound == "tier" and before.bound == "memory"
    assert "starts to pace the step" in d1.findings[2].advice[-1]


def test_tokens_per_s_no_memory_could_move_blames_the_figure(capsys):
    """--tokens-per-s 1e6 on an 8B model would stream 15.5 PB/s: the report says the settings
    do not describe what ran; it does not blame a bandwidth the user never gave."""
    argv = ["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "1e6"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "bandwidth (bytes/s) must be" not in out.err and out.err == ""
    assert "1. memory throughput: 1,000,000 tokens/s would move 15.5 PB/s" in out.out
    assert "settings do not describe what ran" in out.out
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["numbers"]["utilisation"] > 4000


def test_too_many_sequences_names_the_largest_batch_that_fits():
    step = cost.decode_step(LLAMA_8B, 512, 32768)
    d = diagnose("llama-3.1-8b", "h100-sxm", 512, 32768, 100)
    assert not d.fits and f"at most {step.max_batch} sequences fit" in d.fit.advice[0]


def test_a_deployment_that_fits_reports_as_before():
    d = diagnose("llama-3.1-8b", "h100-sxm", 8, 4096, 500)
    assert d.fits and d.fit.numbers["fits"] and not d.report().splitlines()[2].startswith("0.")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"network_bandwidth_bytes_per_s": "moon-link"}, "unknown tier 'moon-link'"),
        ({"network_bandwidth_bytes_per_s": 1e-300, "kv_bytes_per_request": 1e9}, "must be >= 1000"),
        ({"network_bandwidth_bytes_per_s": float("nan"), "kv_bytes_per_request": 1e9}, "finite"),
        ({"network_bandwidth_bytes_per_s": "ib-200g"}, "give both or neither"),
        ({"kv_bytes_per_request": 1e9}, "give both or neither"),
        (
            {"kv_bytes_per_request": -1, "network_bandwidth_bytes_per_s": "ib-200g"},
            "KV bytes per request must be > 0",
        ),
        ({"kv_tier": "moon"}, "unknown KV placement 'moon'"),
        ({"measured_bandwidth_bytes_per_s": 1e-300}, "must be >= 1000"),
    ],
)
def test_every_input_is_checked_even_when_a_step_would_not_use_it(kwargs, message):
    with pytest.raises(KvlabError, match=message):
        diagnose("llama-3.1-8b", "h100-sxm", 8, 4096, 500, **kwargs)


def test_cli_network_and_tier_are_validated_when_unused(capsys):
    base = ["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "100"]
    for extra, fragment in (
        (["--network", "1e-300", "--kv-bytes-per-request", "1e9"], "must be >= 1000"),
        (["--network", "nope"], "unknown tier 'nope'"),
        (["--network", "ib-200g"], "give both or neither"),
        (["--kv-tier", "moon"], "unknown KV placement"),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1


def test_a_tiny_measurement_prints_a_short_number(capsys):
    """1e-300 tokens/s: the utilisation is a denormal; it prints as 4.64e-301%, not as a
    percentage with 300 zeros."""
    assert main(["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "1e-300"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) < 200 and "e-30" in out
    assert main(["diagnose", "--model", "llama-3.1-8b", "--tokens-per-s", "1e-300", "--json"]) == 0
    json.loads(capsys.readouterr().out)


def test_the_steps_are_functions_and_agree_with_the_whole():
    d = diagnose(
        "llama-3.1-8b",
        "h100-sxm",
        8,
        16384,
        30,
        kv_tier="host-pcie5",
        network_bandwidth_bytes_per_s="ib-200g",
        kv_bytes_per_request=4096 * 131072,
    )
    inputs = module._checked(
        module._Inputs(
            "llama-3.1-8b",
            "h100-sxm",
            8,
            16384,
            30,
            "fp16",
            "fp16",
            None,
            "host-pcie5",
            "ib-200g",
            4096 * 131072,
        )
    )
    step = cost.decode_step(LLAMA_8B, 8, 16384)
    tier, _, tiered = module._kv_tier(inputs)
    assert d.findings == [
        module._memory_throughput(inputs, step),
        module._ceiling(inputs, step, tiered),
        module._weights_or_kv(inputs, step, tiered),
        tier,
        module._network(inputs, step),
    ]


def test_numbers_far_from_one_print_in_scientific_notation():
    assert fmt.percent(4.64e-303) == "4.64e-301%"
    assert fmt.rate(1e-300) == "1.000e-300"
    assert fmt.sig(2.5e22, 3) == "2.50e+22"
    # the usual range is unchanged
    assert fmt.sig(0.00123, 3) == "0.00123" and fmt.sig(137.6, 4) == "137.6"


def test_a_profiler_tells_kernels_from_gaps():
    """Kernels at 85% of the bandwidth while they run, the wall clock at 50% of the ceiling:
    the missing time is gaps between kernels (launches, host work), not bandwidth."""
    step = cost.decode_step(LLAMA_8B, 8, 16384)
    peak = step.bandwidth_bytes_per_s
    d = diagnose(
        "llama-3.1-8b",
        "h100-sxm",
        8,
        16384,
        0.5 * step.tokens_per_s,
        measured_bandwidth_bytes_per_s=0.85 * peak,
    )
    one, two = d.findings[0], d.findings[1]
    assert d.bound == "launch and host overheads"
    assert one.numbers["utilisation"] == pytest.approx(0.85)
    assert one.numbers["busy_share"] == pytest.approx(0.5 / 0.85)
    assert two.numbers["fraction_of_ceiling"] == pytest.approx(0.5)
    assert any("CUDA graph" in a for a in one.advice)
    # without a profiler, step 1 says it only repeats step 2
    plain = diagnose("llama-3.1-8b", "h100-sxm", 8, 16384, 0.5 * step.tokens_per_s)
    assert plain.findings[0].numbers["utilisation"] == pytest.approx(
        plain.findings[1].numbers["fraction_of_ceiling"]
    )
    assert any("repeats step 2" in a for a in plain.findings[0].advice)


def test_a_slow_tier_sets_the_ceiling():
    """KV served from host memory: step 2 measures against that tier's ceiling, and a
    measurement above it is flagged as not describing what ran."""
    t = tiered_decode_step(LLAMA_8B, 8, 16384, "host-pcie5")
    ok = diagnose("llama-3.1-8b", "h100-sxm", 8, 16384, 0.9 * t.tokens_per_s, kv_tier="host-pcie5")
    assert ok.findings[1].numbers["ceiling_tokens_per_s"] == pytest.approx(t.tokens_per_s)
    assert ok.findings[1].numbers["fraction_of_ceiling"] == pytest.approx(0.9)
    too_fast = diagnose(
        "llama-3.1-8b", "h100-sxm", 8, 16384, 2 * t.tokens_per_s, kv_tier="host-pcie5"
    )
    assert (
        "above" in too_fast.findings[1].verdict
        and "settings do not describe" in too_fast.findings[1].advice[0]
    )
