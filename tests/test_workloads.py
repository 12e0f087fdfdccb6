"""Generated workloads given as a trace argument: `poisson:rate=R,prompt=P,output=O,...`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sim import simulate
from kvlab.traces import load_trace, trace_stats
from kvlab.traces.generate import parse_poisson, poisson_trace

SPEC = "poisson:rate=5,prompt=lognormal(1024,0.5),output=uniform(16,64),requests=2000,seed=7"


def test_same_text_same_trace_and_seeds_differ():
    a = poisson_trace(SPEC)
    b = poisson_trace(SPEC)
    assert a.requests == b.requests and a.name == b.name == SPEC
    c = poisson_trace(SPEC.replace("seed=7", "seed=8"))
    assert not np.array_equal(a.arrival_s, c.arrival_s) and not np.array_equal(
        a.input_tokens, c.input_tokens
    )
    assert load_trace(SPEC) is load_trace(SPEC)  # loaded once


def test_arrivals_and_lengths_follow_the_spec():
    t = poisson_trace(SPEC)
    assert t.generated and t.label.endswith("(generated)") and len(t) == 2000
    arrivals = t.arrival_s
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    assert gaps.mean() == pytest.approx(1 / 5, rel=0.08)  # exponential gaps, mean 1/rate
    assert np.std(gaps) == pytest.approx(1 / 5, rel=0.1)  # ... whose spread equals their mean
    # lognormal(mean, sigma): the mean is 1024
    assert t.input_tokens.mean() == pytest.approx(1024, rel=0.05)
    assert np.log(t.input_tokens).std() == pytest.approx(0.5, rel=0.08)
    out = t.output_tokens
    assert out.min() >= 16 and out.max() <= 64 and set(out.tolist()) == set(range(16, 65))


def test_every_prompt_is_unique_and_blocks_match_lengths():
    t = poisson_trace("poisson:rate=100,prompt=1500,output=10,requests=50")
    assert (t.input_tokens == 1500).all() and (t.output_tokens == 10).all()
    ids = [h for r in t.requests for h in r.hash_ids]
    assert len(ids) == len(set(ids)) == 50 * 3  # ceil(1500 / 512) blocks each, none shared
    s = trace_stats(t)
    assert s.shared_prefix_requests == 0 and s.unique_blocks == s.block_refs


def test_defaults_and_canonical_name():
    spec = parse_poisson("poisson:output=8,prompt=exponential(300),rate=2.5")
    assert spec.requests == 1000 and spec.seed == 0
    assert spec.text == "poisson:rate=2.5,prompt=exponential(300),output=8,requests=1000,seed=0"


@pytest.mark.parametrize(
    "text, says",
    [
        ("poisson:rate=4", "missing prompt, output"),
        (
            "poisson:rate=4,prompt=lognormal(1024),output=5",
            "field 2 (prompt=lognormal(1024)): lognormal takes (mean, sigma)",
        ),
        ("poisson:rate=x,prompt=1,output=1", "field 1 (rate=x): 'x' is not a number"),
        ("poisson:rate=4,prompt=1,output=1,foo=2", "field 4 ('foo=2'): unknown name 'foo'"),
        ("poisson:rate=4,prompt=gamma(1,2),output=1", "unknown length distribution 'gamma'"),
        ("poisson:rate=4,prompt=1e400,output=3", "finite"),
        ("poisson:rate=nan,prompt=1,output=3", "finite"),
        ("poisson:rate=4,prompt=1,output=1,rate=3", "'rate' is given twice"),
        ("poisson:rate=4,prompt=lognormal(1024,0.5,output=1", "never closed"),
        ("poisson:rate=4,prompt=1),output=1", "closes nothing"),
        ("poisson:rate=0,prompt=1,output=1", "must be > 0"),
        ("poisson:rate=4,prompt=1.5,output=1", "whole number"),
        ("poisson:rate=4,prompt=0,output=1", ">= 1"),
        ("poisson:rate=4,prompt=uniform(5,2),output=1", "low (5) is above high (2)"),
        ("poisson:rate=4,prompt=uniform(1.5,3),output=1", "whole number"),
        ("poisson:rate=4,prompt=1,output=1,requests=0", ">= 1"),
        ("poisson:rate=4,prompt=1,output=1,seed=-1", ">= 0"),
        ("poisson:rate=4,,prompt=1,output=1", "field 2 (''): expected NAME=VALUE"),
        ("poisson:rate=1,prompt=lognormal(1000000,4),output=1", "beyond 10,000,000"),
    ],
)
def test_bad_specs_name_the_field(text, says):
    with pytest.raises(KvlabError) as err:
        load_trace(text)
    assert says in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=40, deadline=None)
# no q: no huge requests=
@given(st.text(alphabet="poisn:ratempu=,()0123456789.lgxf-", max_size=60))
def test_any_spec_text_loads_or_says_why(text):
    try:
        t = load_trace("poisson:" + text)
    except KvlabError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert len(t) >= 1 and all(r.input_tokens >= 1 and r.output_tokens >= 1 for r in t.requests)


def test_cli_takes_a_poisson_workload(capsys):
    assert (
        main(["trace", "stats", "poisson:rate=10,prompt=512,output=32,requests=30", "--json"]) == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 30 and stats["mean_input_tokens"] == 512 and stats["generated"]
    assert main(["simulate", "poisson:rate=10,prompt=512,output=oops", "--arch", "colocated"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "field 3 (output=oops)" in err


# ------------------------------------------------------------ shared prefixes (a cache ratio)


def test_shared_prefixes_set_the_cache_ratio():
    """shared=F: each prompt's first F of its tokens (whole 512-token blocks) come from the
    pool; an infinite cache then serves about F of every prompt after the pool's first use."""
    half = poisson_trace("poisson:rate=4,prompt=8192,output=229,requests=500,shared=0.5")
    assert half.name.endswith(",shared=0.5,prefixes=1")
    ids = [r.hash_ids for r in half.requests]
    assert all(h[:8] == ids[0][:8] for h in ids)  # 4,096 tokens: 8 whole blocks, shared
    assert len({h[8] for h in ids}) == len(ids)  # the rest is each prompt's own
    s = trace_stats(half)
    assert s.reusable_token_share == pytest.approx(0.5 * 499 / 500, abs=1e-9)
    leval = poisson_trace(
        "poisson:rate=4,prompt=19019,output=72,requests=1000,prefix=16384,prefixes=20"
    )
    assert trace_stats(leval).reusable_token_share > 0.8  # the Mooncake report's L-Eval: >80%
    heads = {r.hash_ids[0] for r in leval.requests}
    assert len(heads) == 20  # 20 documents
    plain = poisson_trace("poisson:rate=4,prompt=8192,output=229,requests=500")
    assert trace_stats(plain).reusable_token_share == 0.0


def test_lengths_vary_and_the_last_token_is_never_shared():
    t = poisson_trace(
        "poisson:rate=4,prompt=lognormal(3000,0.8),output=50,requests=400,shared=0.6,"
        "prefix=4096,prefixes=3,seed=2"
    )
    for r in t.requests:
        assert len(r.hash_ids) == -(-r.input_tokens // 512) and len(set(r.hash_ids)) == len(
            r.hash_ids
        )
    s = trace_stats(t)
    assert 0.35 < s.reusable_token_share < 0.6  # capped at 4,096 tokens, rounded to blocks
    one = poisson_trace("poisson:rate=4,prompt=512,output=5,requests=50,shared=1")
    assert trace_stats(one).reusable_token_share == 0.0  # 511 tokens at most: no whole block


def test_the_simulated_prefix_cache_hits_on_the_shared_part():
    t = "poisson:rate=2,prompt=8192,output=20,requests=60,shared=0.5"
    r = simulate(t, arch="colocated", prefill_workers=1, decode_workers=0)
    cached = r.records["cached_tokens"]
    assert cached[0] == 0 and (cached[1:] == 4096).all()
    assert r.prefix_hit_ratio == pytest.approx(0.5 * 59 / 60)
    none = simulate(t.replace(",shared=0.5", ""), arch="colocated", prefill_workers=1)
    assert none.prefix_hit_ratio == 0.0


@pytest.mark.parametrize(
    "text, says",
    [
        ("poisson:rate=4,prompt=100,output=5,shared=1.5", "field 4 (shared=1.5) must be <= 1"),
        ("poisson:rate=4,prompt=100,output=5,shared=x", "'x' is not a number"),
        ("poisson:rate=4,prompt=100,output=5,prefix=0", ">= 1"),
        ("poisson:rate=4,prompt=100,output=5,prefix=2.5", "whole number"),
        ("poisson:rate=4,prompt=100,output=5,prefixes=3", "needs shared=F or prefix=T"),
        ("poisson:rate=4,prompt=100,output=5,shared=0.5,prefixes=0", ">= 1"),
        ("poisson:rate=1e-12,prompt=100,output=5,requests=10", "beyond 4.29e+09 s"),
        ("poisson:rate=4,prompt=1e7,output=5,requests=1e4", "blocks of 512 tokens"),
    ],
)
def test_bad_pool_and_bounds_name_the_field(text, says):
    with pytest.raises(KvlabError) as err:
        load_trace(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_lone_request_at_a_tiny_rate_is_fine():
    t = poisson_trace("poisson:rate=1e-308,prompt=10,output=5,requests=1")
    assert len(t) == 1 and t.requests[0].arrival_s == 0.0
