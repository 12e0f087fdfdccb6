"""Generated request traces with realistic shared prefixes, for tests and trace-less book builds.

A prompt is a list of *segments* (a system prompt, a few-shot template, a user message, an
earlier response), each a run of token ids. Sessions start as a Poisson process; each
session has a geometric number of turns, and turn k+1's prompt is turn k's prompt plus its
response plus a new user message, as in a chat. Token ids are a pure function of
(seed, segment id, position), so prompts can be materialised for a token-level radix cache,
and block hash_ids follow the Mooncake meaning: an id names a 512-token block *and its whole
prefix* (two prompts get the same k-th id exactly when their first k blocks hold the same
tokens). Everything made here is marked `generated=True`; figures label it so.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .errors import KvlabError, check_number, unknown_name
from .traces import BLOCK_TOKENS, Request, Trace

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class WorkloadSpec:
    """Knobs of a generated workload. Lengths in tokens (means of lognormals), times in seconds."""

    requests: int = 2000  # requests in the trace (the first ones by arrival)
    rate_per_s: float = 4.0  # mean request rate; sessions start at rate_per_s / turns_mean (Poisson)
    system_prompts: int = 4  # distinct system prompts, popularity ~ Zipf(popularity_exponent)
    system_tokens: int = 1500  # mean system-prompt length
    templates: int = 8  # few-shot templates (each bound to one system prompt)
    template_tokens: int = 2500  # mean template length
    template_share: float = 0.5  # share of new sessions whose prompt includes a template
    popularity_exponent: float = 1.0  # Zipf exponent for choosing system prompts and templates
    first_message_tokens: int = 1500  # mean length of a session's first user message (document, question)
    first_message_sigma: float = 0.8  # lognormal sigma of that length (heavy tail: pasted documents)
    followup_tokens: int = 300  # mean length of a later turn's user message
    followup_sigma: float = 0.8
    output_tokens: int = 250  # mean response length
    output_sigma: float = 0.8
    turns_mean: float = 2.0  # mean turns per session (geometric, >= 1)
    think_time_s: float = 30.0  # mean gap between a session's turns (exponential)
    repeat_share: float = 0.0  # share of new sessions that resend an earlier first prompt verbatim
    max_input_tokens: int = 131072  # a session ends before its prompt would exceed this
    vocab_size: int = 32000
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self):
        for name in ("requests", "system_prompts", "system_tokens", "template_tokens", "first_message_tokens",
                     "followup_tokens", "output_tokens", "max_input_tokens", "vocab_size", "block_tokens"):
            check_number(name, getattr(self, name), minimum=1, allow_equal_min=True, maximum=1e9, integer=True)
        check_number("templates", self.templates, minimum=0, allow_equal_min=True, maximum=1e6, integer=True)
        check_number("rate_per_s", self.rate_per_s, maximum=1e6)
        check_number("turns_mean", self.turns_mean, minimum=1, allow_equal_min=True, maximum=1e4)
        check_number("think_time_s", self.think_time_s, minimum=0, allow_equal_min=True, maximum=1e6)
        check_number("popularity_exponent", self.popularity_exponent, minimum=0, allow_equal_min=True, maximum=10)
        for name in ("template_share", "repeat_share"):
            check_number(name, getattr(self, name), minimum=0, allow_equal_min=True, maximum=1)
        for name in ("first_message_sigma", "followup_sigma", "output_sigma"):
            check_number(name, getattr(self, name), minimum=0, allow_equal_min=True, maximum=4)
        if self.system_tokens + 1 > self.max_input_tokens:
            raise KvlabError("max_input_tokens must leave room for more than the system prompt")


#: Named workloads. `conversation` resembles a long-context chat service (one hot system
#: prompt, long first messages, a few turns); `shared-prefix` is a templated service whose
#: requests share long system prompts and few-shot templates but end in a unique suffix.
PRESETS: dict[str, WorkloadSpec] = {
    "conversation": WorkloadSpec(
        requests=12000, rate_per_s=3.4, system_prompts=1, system_tokens=900, templates=0,
        first_message_tokens=9000, first_message_sigma=1.2, followup_tokens=400, followup_sigma=1.0,
        output_tokens=350, output_sigma=0.9, turns_mean=2.0, think_time_s=60.0, repeat_share=0.01,
    ),
    "shared-prefix": WorkloadSpec(
        requests=1500, rate_per_s=4.0, system_prompts=4, system_tokens=2000, templates=12,
        template_tokens=3000, template_share=0.8, first_message_tokens=1500, first_message_sigma=0.8,
        followup_tokens=300, output_tokens=200, turns_mean=1.25, think_time_s=20.0, repeat_share=0.03,
    ),
}


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One generated request: its prompt as segments, and its response segment."""

    arrival_s: float
    segments: tuple[tuple[int, int], ...]  # (segment id, tokens), in prompt order
    output: tuple[int, int]  # the response (segment id, tokens); the next turn's prompt contains it
    session: int
    turn: int  # 0 for a session's first request

    @property
    def input_tokens(self) -> int:
        return sum(n for _, n in self.segments)

    @property
    def output_tokens(self) -> int:
        return self.output[1]


def segment_tokens(seed: int, segment: int, length: int, vocab_size: int) -> np.ndarray:
    """Token ids of a segment: splitmix64 of (seed, segment, position), so any prefix is reproducible."""
    base = ((seed * 0x9E3779B97F4A7C15) ^ (segment * 0xC2B2AE3D27D4EB4F)) & _MASK64
    z = np.arange(length, dtype=np.uint64) + np.uint64(base)
    z += np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z % np.uint64(vocab_size)).astype(np.int32)


@dataclass(frozen=True)
class Workload:
    """A generated workload at token level; `to_trace()` gives its Mooncake-format view."""

    name: str
    spec: WorkloadSpec
    seed: int
    requests: tuple[GenRequest, ...]

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def source(self) -> str:
        changed = {f.name: getattr(self.spec, f.name) for f in dataclasses.fields(self.spec)
                   if getattr(self.spec, f.name) != getattr(PRESETS.get(self.name, WorkloadSpec()), f.name)}
        extra = "".join(f", {k}={v!r}" for k, v in changed.items())
        return f"kvlab.traces_gen (preset {self.name!r}, seed {self.seed}{extra})"

    def _segment(self, seg: int, length: int, cache: dict | None) -> np.ndarray:
        if cache is not None and seg in cache and len(cache[seg]) >= length:
            return cache[seg][:length]
        tokens = segment_tokens(self.seed, seg, length, self.spec.vocab_size)
        if cache is not None:
            cache[seg] = tokens
        return tokens

    def prompt_tokens(self, i: int, cache: dict | None = None) -> np.ndarray:
        """Token ids of request i's prompt (int32). Pass one dict as `cache` across calls to reuse segments."""
        return np.concatenate([self._segment(s, n, cache) for s, n in self.requests[i].segments])

    def output_token_ids(self, i: int, cache: dict | None = None) -> np.ndarray:
        """Token ids of request i's response."""
        s, n = self.requests[i].output
        return self._segment(s, n, cache)

    def to_trace(self) -> Trace:
        """The Mooncake-format trace of this workload (hash_ids per block, `generated=True`)."""
        bt = self.spec.block_tokens
        intern: dict[tuple, int] = {}
        out = []
        for r in self.requests:
            out.append(Request(r.arrival_s, r.input_tokens, r.output_tokens, block_ids(r.segments, bt, intern)))
        return Trace(f"generated-{self.name}", tuple(out), source=self.source, generated=True, block_tokens=bt)


def block_ids(segments, block_tokens: int, intern: dict) -> tuple[int, ...]:
    """hash_ids of a prompt made of segments: block k's id names its content and block k-1's id.

    A block's content is described by the (segment, start, end) pieces it covers; segments
    have distinct random tokens, so equal descriptions <=> equal tokens, and chaining the
    previous id makes an id stand for the whole prefix, as in the Mooncake traces.
    """
    ids: list[int] = []
    prev = -1
    pieces: list[tuple[int, int, int]] = []
    filled = 0
    for seg, length in segments:
        start = 0
        while start < length:
            take = min(length - start, block_tokens - filled)
            pieces.append((seg, start, start + take))
            filled += take
            start += take
            if filled == block_tokens:
                prev = intern.setdefault((prev, tuple(pieces)), len(intern))
                ids.append(prev)
                pieces, filled = [], 0
    if pieces:
        prev = intern.setdefault((prev, tuple(pieces)), len(intern))
        ids.append(prev)
    return tuple(ids)


def _lognormal(rng, mean: float, sigma: float, size=None):
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size))).astype(np.int64)


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** exponent
    return w / w.sum()


def generate_workload(preset: str | WorkloadSpec = "shared-prefix", seed: int = 0, **overrides) -> Workload:
    """A seeded workload; `overrides` replace fields of the preset (e.g. first_message_tokens=4000)."""
    if isinstance(preset, WorkloadSpec):
        name, spec = "custom", preset
    elif preset in PRESETS:
        name, spec = preset, PRESETS[preset]
    else:
        raise unknown_name("generated-trace preset", preset, PRESETS)
    bad = set(overrides) - {f.name for f in dataclasses.fields(WorkloadSpec)}
    if bad:
        raise unknown_name("workload knob", sorted(bad)[0], [f.name for f in dataclasses.fields(WorkloadSpec)])
    spec = dataclasses.replace(spec, **overrides)
    seed = check_number("seed", seed, minimum=0, allow_equal_min=True, maximum=2**63 - 1, integer=True)
    arrivals_rng, lengths_rng, choice_rng, turns_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))

    # Shared segments: ids 0..S-1 are system prompts, S..S+T-1 templates (each bound to a system prompt).
    n_sys, n_tpl = spec.system_prompts, spec.templates
    sys_len = np.minimum(_lognormal(lengths_rng, spec.system_tokens, 0.2, n_sys), spec.max_input_tokens // 2)
    tpl_len = _lognormal(lengths_rng, spec.template_tokens, 0.2, n_tpl) if n_tpl else np.zeros(0, np.int64)
    tpl_sys = choice_rng.integers(0, n_sys, n_tpl) if n_tpl else np.zeros(0, np.int64)
    sys_w = _zipf_weights(n_sys, spec.popularity_exponent)
    next_seg = n_sys + n_tpl
    session_rate = spec.rate_per_s / spec.turns_mean
    p_end = 1.0 / spec.turns_mean

    requests: list[GenRequest] = []
    first_prompts: list[tuple] = []
    start, session, cutoff = 0.0, 0, math.inf
    while True:
        start += arrivals_rng.exponential(1.0 / session_rate)
        if len(requests) >= spec.requests:
            if start > cutoff:
                break
            if session % 64 == 0:
                cutoff = float(np.partition([r.arrival_s for r in requests], spec.requests - 1)[spec.requests - 1])
        if first_prompts and choice_rng.random() < spec.repeat_share:
            history = list(first_prompts[choice_rng.integers(len(first_prompts))])
            turns = 1  # a resent prompt (a retry, a popular query) stands alone
        else:
            s = int(choice_rng.choice(n_sys, p=sys_w))
            history = [(s, int(sys_len[s]))]
            own = np.flatnonzero(tpl_sys == s)
            if len(own) and choice_rng.random() < spec.template_share:
                t = int(own[choice_rng.choice(len(own), p=_zipf_weights(len(own), spec.popularity_exponent))])
                history.append((n_sys + t, int(tpl_len[t])))
            history.append((next_seg, int(_lognormal(lengths_rng, spec.first_message_tokens, spec.first_message_sigma))))
            next_seg += 1
            turns = int(turns_rng.geometric(p_end))
            first_prompts.append(tuple(history))
        t_arrive = start
        for turn in range(turns):
            if turn:
                t_arrive += turns_rng.exponential(spec.think_time_s) if spec.think_time_s else 0.0
                history += [out, (next_seg, int(_lognormal(lengths_rng, spec.followup_tokens, spec.followup_sigma)))]
                next_seg += 1
            total = sum(n for _, n in history)
            if total > spec.max_input_tokens:
                if turn:
                    break
                keep = max(1, history[-1][1] - (total - spec.max_input_tokens))  # clip a huge first message
                history[-1] = (history[-1][0], keep)
            out = (next_seg, int(_lognormal(lengths_rng, spec.output_tokens, spec.output_sigma)))
            next_seg += 1
            requests.append(GenRequest(float(t_arrive), tuple(history), out, session, turn))
        session += 1
    requests.sort(key=lambda r: r.arrival_s)
    return Workload(name, spec, seed, tuple(requests[: spec.requests]))


def generate_trace(preset: str | WorkloadSpec = "conversation", seed: int = 0, **overrides) -> Trace:
    """A generated Mooncake-format trace (`generated=True`, `source` names generator, preset and seed)."""
    return generate_workload(preset, seed=seed, **overrides).to_trace()
