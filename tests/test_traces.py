"""Traces: loading and validation, statistics, the generator, the download (local server)."""

from __future__ import annotations

import hashlib
import http.server
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import traces
from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.traces import Request, Trace, load_trace, read_jsonl, trace_stats
from kvlab.traces import cache as traces_cache
from kvlab.traces import download as traces_download
from kvlab.traces.generate import (
    PRESETS,
    WorkloadSpec,
    block_ids,
    generate_trace,
    generate_workload,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mooncake"
HAVE_REAL = (SHARED / "conversation_trace.jsonl").is_file()
real = pytest.mark.skipif(not HAVE_REAL, reason="the Mooncake traces are not on this machine")


def line(ts=0, inp=1000, out=10, ids=(1, 2)):
    return json.dumps(
        {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": list(ids)}
    )


def write(tmp_path, *lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def prefix_violations(trace) -> int:
    """Ids seen at two positions or after two predecessors (breaks 'an id names its prefix')."""
    where, bad = {}, 0
    for r in trace.requests:
        prev = None
        for k, h in enumerate(r.hash_ids):
            bad += where.setdefault(h, (k, prev)) != (k, prev)
            prev = h
    return bad


# ------------------------------------------------------------------ loading and validation


def test_a_small_trace_loads(tmp_path):
    path = write(tmp_path, line(0, 1000, 5, [7, 8]), "", line(1500, 512, 3, [7]))
    t = read_jsonl(path)
    assert t.name == "t" and len(t) == 2 and not t.generated and t.label == "t"
    assert t.requests[1] == Request(1.5, 512, 3, (7,))
    assert t.arrival_s.tolist() == [0.0, 1.5] and t.input_tokens.tolist() == [1000, 512]


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"timestamp": 0, "input_length": 10', "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"timestamp": 5, "output_length": 1, "hash_ids": [1]}', "line 2: missing 'input_length'"),
        (
            line(5, 1000, 1, [1]),
            "line 2: 1 hash_ids for input_length 1000; expected ceil(1000/512) = 2",
        ),
        (line(5, 600, 1, [1, 1]), "line 2: 'hash_ids' repeats an id"),
        (line(5, 600, 0, [1, 2]), "line 2: 'output_length' must be >= 1"),
        (line(5, 6.5, 1, [1]), "line 2: 'input_length' must be a whole number"),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [-1]}',
            "line 2: 'hash_ids' must be",
        ),
        (line(-1, 600, 1, [1, 2]), "line 2: 'timestamp' must be >= 0"),
    ],
)
def test_malformed_lines_are_named(tmp_path, bad, message):
    path = write(tmp_path, line(0), bad)
    with pytest.raises(
        KvlabError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        read_jsonl(path)


def test_time_going_backwards_names_the_line(tmp_path):
    path = write(tmp_path, line(100), line(200), line(150))
    with pytest.raises(
        KvlabError, match=r"t.jsonl line 3: timestamp 150 ms goes back in time \(previous 200 ms\)"
    ):
        read_jsonl(path)


def test_bad_bytes_and_empty_files(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(line(0).encode() + b"\n" + b'{"timestamp": \xff}\n')
    with pytest.raises(KvlabError, match="b.jsonl line 2: not UTF-8"):
        read_jsonl(path)
    with pytest.raises(KvlabError, match="holds no requests"):
        read_jsonl(write(tmp_path, "", name="e.jsonl"))
    with pytest.raises(KvlabError, match="does not exist"):
        load_trace(tmp_path / "missing.jsonl")


def test_named_traces_are_found_in_the_user_folder_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_TRACE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dirs = traces.trace_dirs()
    assert dirs[0] == tmp_path / "mine" and dirs[1] == tmp_path / "cache" / "kvlab" / "traces"
    (tmp_path / "cache" / "kvlab" / "traces").mkdir(parents=True)
    write(tmp_path / "cache" / "kvlab" / "traces", line(0), name="synthetic_trace.jsonl")
    t = load_trace("synthetic")
    assert t.name == "synthetic" and len(t) == 1
    monkeypatch.delenv("KVLAB_TRACE_DIR")
    assert traces.cache_dir() == tmp_path / "cache" / "kvlab" / "traces"


def test_a_missing_named_trace_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(traces, "trace_dirs", lambda: [tmp_path])
    with pytest.raises(KvlabError, match="kvlab trace download conversation"):
        load_trace("conversation")
    with pytest.raises(
        KvlabError, match="unknown trace 'conversaton'.*Did you mean 'conversation'"
    ):
        load_trace("conversaton")
    stand_in = traces.trace_or_generated("conversation")
    assert stand_in.generated and stand_in.label.endswith("(generated)")


# ------------------------------------------------------------------ statistics


def test_stats_by_hand():
    t = Trace(
        "hand",
        (
            Request(0.0, 1000, 10, (1, 2)),  # new
            Request(1.0, 1100, 20, (1, 2, 3)),  # shares 1,2: 2 reusable blocks, 1024 tokens
            Request(2.0, 300, 30, (9,)),  # new
            Request(4.0, 700, 40, (1, 5)),  # shares block 1: 512 tokens
        ),
        source="hand",
    )
    s = trace_stats(t)
    assert (s.requests, s.block_refs, s.unique_blocks) == (4, 8, 5)
    assert s.mean_input_tokens == 775 and s.mean_output_tokens == 25 and s.duration_s == 4.0
    assert s.shared_prefix_requests == 2 and s.shared_prefix_share == 0.5
    assert s.reusable_block_share == 3 / 8
    assert s.reusable_token_share == (1024 + 512) / 3100


@real
def test_the_real_traces_match_their_readme():
    c, s = trace_stats(load_trace("conversation")), trace_stats(load_trace("synthetic"))
    assert (c.requests, c.block_refs, c.unique_blocks) == (12031, 288500, 182790)
    assert round(c.mean_input_tokens) == 12035 and round(c.mean_output_tokens) == 343
    assert round(c.duration_s) == 3537
    assert (
        s.requests == 3993 and round(s.mean_input_tokens) == 15325 and round(s.duration_s) == 1022
    )
    # nearly every request shares a system-prompt block, yet an unlimited cache reuses a third
    assert c.shared_prefix_share > 0.999 and 0.36 < c.reusable_block_share < 0.37
    assert prefix_violations(load_trace("conversation")) == 0


# ------------------------------------------------------------------ the generator


def test_the_generator_is_seeded_and_labelled():
    a, b = generate_trace("shared-prefix", seed=7), generate_trace("shared-prefix", seed=7)
    assert a.requests == b.requests
    assert generate_trace("shared-prefix", seed=8).requests != a.requests
    assert a.generated and a.label == "generated-shared-prefix (generated)"
    assert "preset 'shared-prefix', seed 7" in a.source
    assert len(a) == PRESETS["shared-prefix"].requests
    assert np.all(np.diff(a.arrival_s) >= 0)
    t = load_trace("generated:shared-prefix:7")
    assert t.requests == a.requests and t.generated


def test_generated_hash_ids_name_their_prefix():
    w = generate_workload("shared-prefix", seed=3, requests=300)
    t = w.to_trace()
    assert prefix_violations(t) == 0
    for r in t.requests:
        assert len(r.hash_ids) == math.ceil(r.input_tokens / t.block_tokens)
    # the ids equal those computed from the token ids themselves
    by_content: dict = {}
    cache: dict = {}
    for i, r in enumerate(t.requests):
        tokens = w.prompt_tokens(i, cache)
        assert len(tokens) == r.input_tokens
        prev, ids = -1, []
        for start in range(0, len(tokens), t.block_tokens):
            prev = by_content.setdefault(
                (prev, tokens[start : start + t.block_tokens].tobytes()), len(by_content)
            )
            ids.append(prev)
        assert tuple(ids) == r.hash_ids


def test_a_turn_extends_the_previous_turn_and_its_response():
    w = generate_workload("conversation", seed=1, requests=400)
    last = {}
    checked = 0
    for i, r in enumerate(w.requests):
        if r.turn:
            j = last[r.session]
            before = np.concatenate([w.prompt_tokens(j), w.output_token_ids(j)])
            assert np.array_equal(w.prompt_tokens(i)[: len(before)], before)
            assert r.input_tokens > len(before)
            checked += 1
        last[r.session] = i
    assert checked > 50


def test_generator_statistics():
    spec = PRESETS["shared-prefix"]
    w = generate_workload("shared-prefix", seed=0, requests=4000, repeat_share=0.0)
    first = sorted(r.arrival_s for r in w.requests if r.turn == 0)
    gaps = np.diff(first)
    # sessions start as a Poisson process: exponential gaps, mean turns_mean / rate, CV 1
    assert gaps.mean() == pytest.approx(spec.turns_mean / spec.rate_per_s, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)
    outputs = np.array([r.output_tokens for r in w.requests])
    assert outputs.mean() == pytest.approx(spec.output_tokens, rel=0.1)
    turns = np.bincount([r.session for r in w.requests])
    assert turns[turns > 0].mean() == pytest.approx(spec.turns_mean, rel=0.1)
    s = trace_stats(w.to_trace())
    assert s.shared_prefix_share > 0.99  # every prompt starts with one of 4 system prompts
    assert 0.5 < s.reusable_token_share < 0.95


def test_block_ids_by_hand():
    intern: dict = {}
    a = block_ids([(0, 600), (1, 100)], 512, intern)  # blocks: 0[0:512] | 0[512:600]+1[0:100]
    b = block_ids([(0, 600), (2, 100)], 512, intern)
    c = block_ids([(0, 512)], 512, intern)
    assert a[0] == b[0] == c[0] and a[1] != b[1] and len(a) == len(b) == 2 and len(c) == 1


def test_bad_generator_input():
    with pytest.raises(KvlabError, match="unknown generated-trace preset"):
        generate_trace("chatty")
    with pytest.raises(KvlabError, match="unknown workload knob 'user_tokens'"):
        generate_trace("shared-prefix", user_tokens=3)
    with pytest.raises(KvlabError, match="template_share must be <= 1"):
        WorkloadSpec(template_share=2)
    with pytest.raises(KvlabError, match="unknown generated-trace preset 'x'"):
        load_trace("generated:x")


# ------------------------------------------------------------------ download (local server)


@pytest.fixture
def server():
    """Serve a folder over HTTP on 127.0.0.1; yields (folder setter, base url)."""
    state = {"dir": None}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=state["dir"], **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_download_verifies_and_writes_atomically(tmp_path, server, monkeypatch, capsys):
    state, url = server
    served = tmp_path / "served"
    served.mkdir()
    body = (line(0, 600, 3, [1, 2]) + "\n").encode() * 50
    (served / "synthetic_trace.jsonl").write_bytes(body)
    state["dir"] = str(served)
    monkeypatch.setitem(
        traces_download.SHA256, "synthetic_trace.jsonl", hashlib.sha256(body).hexdigest()
    )
    dest = tmp_path / "dest"
    got = traces_download.download_trace("synthetic", dest, base_url=url)
    assert got.fetched and got.bytes == len(body) and Path(got.path).read_bytes() == body
    umask = os.umask(0)
    os.umask(umask)
    # an ordinary file, not mkstemp's 0600
    assert Path(got.path).stat().st_mode & 0o777 == 0o666 & ~umask
    assert "downloading synthetic_trace.jsonl" in capsys.readouterr().err
    again = traces_download.download_trace("synthetic", dest, base_url=url)
    assert not again.fetched
    # a corrupted copy on the server: a clear error and nothing half-written
    (served / "synthetic_trace.jsonl").write_bytes(body[:-5] + b"XXXX\n")
    with pytest.raises(
        KvlabError, match="checksum mismatch for synthetic_trace.jsonl.*nothing was written"
    ):
        traces_download.download_trace("synthetic", tmp_path / "fresh", base_url=url)
    assert not (tmp_path / "fresh").exists()  # a failed download leaves no folder behind
    with pytest.raises(KvlabError, match="checksum mismatch"):
        traces_download.download_trace("synthetic", dest, base_url=url, force=True)
    assert Path(got.path).read_bytes() == body and sorted(p.name for p in dest.iterdir()) == [
        "synthetic_trace.jsonl"
    ]
    with pytest.raises(KvlabError, match="HTTP 404"):
        traces_download.download_trace("conversation", tmp_path / "x", base_url=url)


@real
def test_the_cli_downloads_the_real_traces_from_a_mirror(tmp_path, server, monkeypatch, capsys):
    state, url = server
    state["dir"] = str(SHARED)
    monkeypatch.setenv("KVLAB_TRACE_DIR", str(tmp_path / "traces"))
    code = main(["trace", "download", "--base-url", url, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and set(out) == {"conversation", "synthetic"}
    assert out["conversation"]["sha256"] == traces_download.SHA256["conversation_trace.jsonl"]
    assert traces.find_trace("conversation") == tmp_path / "traces" / "conversation_trace.jsonl"


# ------------------------------------------------------------------ CLI

STATS_KEYS = {
    "requests",
    "mean_input_tokens",
    "mean_output_tokens",
    "duration_s",
    "block_refs",
    "unique_blocks",
}


def test_trace_stats_cli(tmp_path, capsys):
    path = write(tmp_path, line(0, 1000, 10, [1, 2]), line(2000, 600, 20, [1, 3]))
    assert main(["trace", "stats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert STATS_KEYS <= set(out)
    assert (
        out["requests"] == 2
        and out["block_refs"] == 4
        and out["unique_blocks"] == 3
        and out["duration_s"] == 2.0
    )
    assert main(["trace", "stats", str(path)]) == 0
    assert "share a prefix" in capsys.readouterr().out
    bad = write(tmp_path, line(0), "{oops", name="bad.jsonl")
    assert main(["trace", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl line 2: not valid JSON" in err


def test_trace_commands_do_not_import_heavy_modules():
    code = (
        "import sys; from kvlab.cli import main; main(['trace', 'stats', "
        "'generated:shared-prefix']); "
        "heavy = [m for m in ('torch', 'bokeh', 'ipywidgets') if m in sys.modules]; "
        "sys.stderr.write(repr(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.endswith("[]")


# ------------------------------------------------------------------ hostile input


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            '{"timestamp": 5, "input_length": 600, "output_length": '
            + "1"
            + "0" * 400
            + ', "hash_ids": [1, 2]}',
            "'output_length' must be <= 1e\\+08, got an integer of about 401 digits",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": '
            + "9" * 5000
            + ', "hash_ids": [1, 2]}',
            "line 2: not valid JSON",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 1e400, "hash_ids": [1, 2]}',
            "'output_length' must be a whole number, got inf",
        ),
        (
            '{"timestamp": NaN, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}',
            "'timestamp' must be a whole number, got nan",
        ),
        (
            '{"timestamp": 1e20, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}',
            "'timestamp' must be <=",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": true, "hash_ids": [1, 2]}',
            "whole number, got True",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, '
            + str(2**64)
            + "]}",
            "'hash_ids' must be a list of whole numbers",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, true]}',
            "'hash_ids' must be",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": "1,2"}',
            "'hash_ids' must be",
        ),
        ("[" * 100_000 + "]" * 100_000, "line 2: nested too deeply"),
    ],
)
def test_hostile_lines_are_one_clear_error(tmp_path, bad, message):
    path = write(tmp_path, line(0), bad)
    with pytest.raises(KvlabError, match=message):
        read_jsonl(path)


def test_one_instant_trace_has_no_rate_and_json_says_null(tmp_path, capsys):
    """Every one-request trace (or all requests in one millisecond): the rate is not a number
    JSON can hold, so `--json` prints null, as kvlab does for every unbounded value."""
    path = write(tmp_path, line(7, 600, 3, [1, 2]))
    s = trace_stats(read_jsonl(path))
    assert s.duration_s == 0 and s.requests_per_s == math.inf
    assert s.to_dict()["requests_per_s"] is None
    assert main(["trace", "stats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_per_s"] is None and out["duration_s"] == 0
    assert main(["trace", "stats", str(path)]) == 0
    assert "0 s (a single request)" in capsys.readouterr().out


def test_names_longer_than_the_file_system_allows(capsys):
    for name in ("x" * 5000, "x" * 5000 + ".jsonl", "/tmp/" + "y" * 300 + "/t.jsonl", "a\0b"):
        assert main(["trace", "stats", name]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 600
    assert main(["trace", "stats", "/dev/null"]) == 2  # not a file
    assert "is not a file" in capsys.readouterr().err


def test_a_trace_through_a_pipe(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    body = line(0) + "\n" + line(5) + "\n"
    writer = threading.Thread(target=lambda: fifo.write_text(body), daemon=True)
    writer.start()
    assert len(load_trace(str(fifo))) == 2
    assert len(load_trace(str(fifo))) == 2  # read once, remembered
    writer.join(timeout=5)


def test_download_refuses_a_bad_base_url_before_creating_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KVLAB_TRACE_DIR", raising=False)
    for url in ("not a url", "ftp://example.org/x/", "http://", "javascript:alert(1)"):
        assert main(["trace", "download", "synthetic", "--base-url", url]) == 2
        err = capsys.readouterr().err
        assert "base URL must be an http://, https:// or file:// URL" in err
        assert err.count("\n") == 1
    assert not (tmp_path / "cache").exists()  # not even an empty ~/.cache/kvlab/traces


def test_a_failed_download_leaves_no_empty_folders(tmp_path, server, monkeypatch, capsys):
    """The default cache (~/.cache/kvlab/traces) and a --dir alike: folders the download
    created are removed again when it fails; folders that were there stay."""
    state, url = server
    state["dir"] = str(tmp_path)  # serves nothing under the trace names: HTTP 404
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KVLAB_TRACE_DIR", raising=False)
    assert main(["trace", "download", "synthetic", "--base-url", url]) == 2
    assert "HTTP 404" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
    (tmp_path / "mine").mkdir()
    nested = str(tmp_path / "mine" / "a" / "b")
    assert main(["trace", "download", "synthetic", "--base-url", url, "--dir", nested]) == 2
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
    capsys.readouterr()
    long_dir = str(tmp_path / ("z" * 300))
    assert main(["trace", "download", "synthetic", "--base-url", url, "--dir", long_dir]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


# ------------------------------------------------------------------ fast path = careful path


def _careful(lines):
    """What `read_jsonl` must return: every line through `parse_line`, in order."""
    out, last = [], 0.0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        req = traces.parse_line(text, f"t.jsonl line {number}")
        if req.arrival_s < last:
            raise KvlabError(f"t.jsonl line {number}: goes back in time")
        last = req.arrival_s
        out.append(req)
    return out


def _outcome(fn, *args):
    try:
        return fn(*args)
    except KvlabError as exc:
        return str(exc).split(":")[0]  # which line failed


def _blocks(tokens):
    return -(-tokens // 512)


field_value = st.one_of(
    st.integers(-5, 3000), st.floats(-1, 3000), st.booleans(), st.none(), st.text(max_size=3)
)
request_dict = st.fixed_dictionaries(
    {
        "timestamp": st.one_of(st.integers(0, 10_000), field_value),
        "input_length": st.one_of(st.integers(1, 2000), field_value),
        "output_length": st.one_of(st.integers(1, 50), field_value),
    }
).flatmap(
    lambda d: st.fixed_dictionaries(
        {
            **{k: st.just(v) for k, v in d.items()},
            "hash_ids": st.one_of(
                st.lists(
                    st.integers(0, 40),
                    min_size=_blocks(d["input_length"]),
                    max_size=_blocks(d["input_length"]),
                    unique=True,
                )
                if isinstance(d["input_length"], int) and 0 < d["input_length"] <= 2000
                else st.lists(st.integers(0, 40), max_size=4),
                st.lists(field_value, max_size=4),
            ),
        }
    )
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.one_of(request_dict.map(json.dumps), st.sampled_from(["", " ", "{", "[]", "1"])),
        min_size=1,
        max_size=6,
    )
)
def test_the_fast_path_agrees_with_parse_line(lines):
    got = _outcome(traces._parse_lines, "\n".join(lines).encode(), "t.jsonl")
    assert got == _outcome(_careful, lines)


# ------------------------------------------------------------------ parsed traces kept on disk


def test_a_validated_trace_is_kept_parsed_while_the_file_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KVLAB_TRACE_CACHE", raising=False)
    monkeypatch.setattr(traces, "_LOADED", {})
    path = write(tmp_path, line(0, 1000, 5, [7, 8]), line(1500, 512, 3, [7]))
    first = load_trace(str(path))
    kept = list((tmp_path / "cache" / "kvlab" / "parsed").iterdir())
    assert len(kept) == 1

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(traces, "read_jsonl", no_parsing)
    monkeypatch.setattr(traces, "_LOADED", {})
    again = load_trace(str(path))
    assert again.requests == first.requests and again.name == "t" and again.source == str(path)
    # a changed file is parsed again (and so is a damaged cache file)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(traces, "_LOADED", {})
    path.write_text(line(0, 600, 5, [1, 2]) + "\n")
    assert load_trace(str(path)).requests == (Request(0.0, 600, 5, (1, 2)),)
    kept[0].write_bytes(kept[0].read_bytes()[:-3] + b"xyz")
    assert traces_cache.load(path, path.stat(), traces.BLOCK_TOKENS) is None
    monkeypatch.setattr(traces, "_LOADED", {})
    assert len(load_trace(str(path))) == 1


def test_an_invalid_trace_is_never_kept_and_the_cache_can_be_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(traces, "_LOADED", {})
    bad = write(tmp_path, line(0), "{oops", name="bad.jsonl")
    for _ in range(2):
        with pytest.raises(KvlabError, match="bad.jsonl line 2"):
            load_trace(str(bad))
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv("KVLAB_TRACE_CACHE", "0")
    load_trace(str(write(tmp_path, line(0))))
    assert not (tmp_path / "cache").exists()
