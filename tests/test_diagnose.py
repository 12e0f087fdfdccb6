"""The five-step diagnosis: verdicts follow the article's thresholds, numbers come from the ledger."""
import json

import pytest

from kvlab import cost
from kvlab.cli import main
from kvlab.diagnose import diagnose
from kvlab.errors import KvlabError


def ceiling(**kw):
    return cost.decode_step("llama-3.1-8b", "h100-sxm", **kw).tokens_per_s


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
    step = cost.decode_step("llama-3.1-8b", "h100-sxm", 8, 4096)
    d = diagnose("llama-3.1-8b", "h100-sxm", 8, 4096, step.tokens_per_s, network_bandwidth_bytes_per_s="ib-200g",
                 kv_bytes_per_request=4096 * 131072)
    five = d.findings[4]
    assert five.numbers["transfer_s"] == pytest.approx(4096 * 131072 / 25e9)
    assert five.numbers["transfer_in_decode_steps"] == pytest.approx(five.numbers["transfer_s"] / step.step_time_s)


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
