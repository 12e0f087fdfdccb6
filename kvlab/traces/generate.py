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

from ..errors import KvlabError, check_number, unknown_name
from .types import BLOCK_TOKENS, Request, Trace

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class WorkloadSpec:
    """Knobs of a generated workload. Lengths in tokens (means of lognormals), times in seconds."""

    requests: int = 2000  # requests in the trace (the first ones by arrival)
    rate_per_s: float = (
        4.0  # mean request rate; sessions start at rate_per_s / turns_mean (Poisson)
    )
    system_prompts: int = 4  # distinct system prompts, popularity ~ Zipf(popularity_exponent)
    system_tokens: int = 1500  # mean system-prompt length
    templates: int = 8  # few-shot templates (each bound to one system prompt)
    template_tokens: int = 2500  # mean template length
    template_share: float = 0.5  # share of new sessions whose prompt includes a template
    popularity_exponent: float = 1.0  # Zipf exponent for choosing system prompts and templates
    first_message_tokens: int = (
        1500  # mean length of a session's first user message (document, question)
    )
    first_message_sigma: float = (
        0.8  # lognormal sigma of that length (heavy tail: pasted documents)
    )
    followup_tokens: int = 300  # mean length of a later turn's user message
    followup_sigma: float = 0.8
    output_tokens: int = 250  # mean response length
    output_sigma: float = 0.8
    turns_mean: float = 2.0  # mean turns per session (geometric, >= 1)
    think_time_s: float = 30.0  # mean gap between a session's turns (exponential)
    repeat_share: float = 0.0  # share of new sessions that resend an earlier first prompt verbatim
    #: the context a request fills (Llama 3.1's 131,072): prompt + response stay within it (a
    #: session ends, a first message is clipped, a response stops at it)
    max_input_tokens: int = 131072
    vocab_size: int = 32000
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self):
        for name in (
            "requests",
            "system_prompts",
            "system_tokens",
            "template_tokens",
            "first_message_tokens",
            "followup_tokens",
            "output_tokens",
            "max_input_tokens",
            "vocab_size",
            "block_tokens",
        ):
            check_number(
                name,
                getattr(self, name),
                minimum=1,
                allow_equal_min=True,
                maximum=1e9,
                integer=True,
            )
        check_number(
            "templates", self.templates, minimum=0, allow_equal_min=True, maximum=1e6, integer=True
        )
        check_number("rate_per_s", self.rate_per_s, maximum=1e6)
        check_number("turns_mean", self.turns_mean, minimum=1, allow_equal_min=True, maximum=1e4)
        check_number(
            "think_time_s", self.think_time_s, minimum=0, allow_equal_min=True, maximum=1e6
        )
        check_number(
            "popularity_exponent",
            self.popularity_exponent,
            minimum=0,
            allow_equal_min=True,
            maximum=10,
        )
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
        requests=12000,
        rate_per_s=3.4,
        system_prompts=1,
        system_tokens=900,
        templates=0,
        first_message_tokens=9000,
        first_message_sigma=1.2,
        followup_tokens=400,
        followup_sigma=1.0,
        output_tokens=350,
        output_sigma=0.9,
        turns_mean=2.0,
        think_time_s=60.0,
        repeat_share=0.01,
    ),
    "shared-prefix": WorkloadSpec(
        requests=1500,
        rate_per_s=4.0,
        system_prompts=4,
        system_tokens=2000,
        templates=12,
        template_tokens=3000,
        template_share=0.8,
        first_message_tokens=1500,
        first_message_sigma=0.8,
        followup_tokens=300,
        output_tokens=200,
        turns_mean=1.25,
        think_time_s=20.0,
        repeat_share=0.03,
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
    """Token ids of a segment: splitmix64 of (seed, segment, position): any prefix reproduces."""
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
        changed = {
            f.name: getattr(self.spec, f.name)
            for f in dataclasses.fields(self.spec)
            if getattr(self.spec, f.name) != getattr(PRESETS.get(self.name, WorkloadSpec()), f.name)
        }
        extra = "".join(f", {k}={v!r}" for k, v in changed.items())
        return f"kvlab.traces.generate (preset {self.name!r}, seed {self.seed}{extra})"

    def _segment(self, seg: int, length: int, cache: dict | None) -> np.ndarray:
        if cache is not None and seg in cache and len(cache[seg]) >= length:
            return cache[seg][:length]
        tokens = segment_tokens(self.seed, seg, length, self.spec.vocab_size)
        if cache is not None:
            cache[seg] = tokens
        return tokens

    def prompt_tokens(self, i: int, cache: dict | None = None) -> np.ndarray:
        """Token ids of request i's prompt (int32). Pass one dict as `cache` across calls to
        reuse segments."""
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
            out.append(
                Request(
                    r.arrival_s, r.input_tokens, r.output_tokens, block_ids(r.segments, bt, intern)
                )
            )
        return Trace(
            f"generated-{self.name}",
            tuple(out),
            source=self.source,
            generated=True,
            block_tokens=bt,
        )


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


class _Sessions:
    """The random streams and shared segments of one generated workload, making sessions.

    Segment ids 0..S-1 are system prompts, S..S+T-1 templates (each bound to a system
    prompt); every later segment (a message, a response) gets the next free id.
    """

    def __init__(self, spec: WorkloadSpec, seed: int):
        self.spec = spec
        self.arrivals, self.lengths, self.choice, self.turns_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
        )
        n_sys, n_tpl = spec.system_prompts, spec.templates
        self.sys_len = np.minimum(
            _lognormal(self.lengths, spec.system_tokens, 0.2, n_sys), spec.max_input_tokens // 2
        )
        no_templates = np.zeros(0, np.int64)
        self.tpl_len = (
            _lognormal(self.lengths, spec.template_tokens, 0.2, n_tpl) if n_tpl else no_templates
        )
        self.tpl_sys = self.choice.integers(0, n_sys, n_tpl) if n_tpl else no_templates
        self.sys_w = _zipf_weights(n_sys, spec.popularity_exponent)
        self.next_seg = n_sys + n_tpl
        self.first_prompts: list[tuple] = []

    def _segment(self, mean: float, sigma: float) -> tuple[int, int]:
        seg = (self.next_seg, int(_lognormal(self.lengths, mean, sigma)))
        self.next_seg += 1
        return seg

    def opening(self) -> tuple[list, int]:
        """A new session's first prompt (as segments) and its number of turns."""
        spec, choice = self.spec, self.choice
        if self.first_prompts and choice.random() < spec.repeat_share:
            # a resent prompt (a retry, a popular query) stands alone
            return list(self.first_prompts[choice.integers(len(self.first_prompts))]), 1
        s = int(choice.choice(spec.system_prompts, p=self.sys_w))
        history = [(s, int(self.sys_len[s]))]
        own = np.flatnonzero(self.tpl_sys == s)
        if len(own) and choice.random() < spec.template_share:
            weights = _zipf_weights(len(own), spec.popularity_exponent)
            t = int(own[choice.choice(len(own), p=weights)])
            history.append((spec.system_prompts + t, int(self.tpl_len[t])))
        history.append(self._segment(spec.first_message_tokens, spec.first_message_sigma))
        turns = int(self.turns_rng.geometric(1.0 / spec.turns_mean))
        self.first_prompts.append(tuple(history))
        return history, turns

    def requests(self, start_s: float, session: int) -> list[GenRequest]:
        """The requests of one session that starts at `start_s`."""
        spec = self.spec
        history, turns = self.opening()
        out, t_arrive, made = None, start_s, []
        for turn in range(turns):
            if turn:  # the previous prompt + its response + a new message
                if spec.think_time_s:
                    t_arrive += self.turns_rng.exponential(spec.think_time_s)
                history += [out, self._segment(spec.followup_tokens, spec.followup_sigma)]
            total = sum(n for _, n in history)
            if total >= spec.max_input_tokens:  # no room left for a response
                if turn:
                    break
                keep = max(1, history[-1][1] - (total - spec.max_input_tokens + 1))
                history[-1] = (history[-1][0], keep)  # clip a huge first message
                total = sum(n for _, n in history)
            out = self._segment(spec.output_tokens, spec.output_sigma)
            room = spec.max_input_tokens - total
            if out[1] > room:  # the response stops at the context, as an engine stops it
                out = (out[0], max(1, room))
            made.append(GenRequest(float(t_arrive), tuple(history), out, session, turn))
        return made


def generate_workload(
    preset: str | WorkloadSpec = "shared-prefix", seed: int = 0, **overrides
) -> Workload:
    """A seeded workload; `overrides` replace fields of the preset (e.g. first_message_tokens=4000).

    Sessions start as a Poisson process until enough requests exist that every later
    session would start after the last request kept (the first `spec.requests` by arrival).
    """
    if isinstance(preset, WorkloadSpec):
        name, spec = "custom", preset
    elif preset in PRESETS:
        name, spec = preset, PRESETS[preset]
    else:
        raise unknown_name("generated-trace preset", preset, PRESETS)
    knobs = [f.name for f in dataclasses.fields(WorkloadSpec)]
    bad = set(overrides) - set(knobs)
    if bad:
        raise unknown_name("workload knob", sorted(bad)[0], knobs)
    spec = dataclasses.replace(spec, **overrides)
    seed = check_number(
        "seed", seed, minimum=0, allow_equal_min=True, maximum=2**63 - 1, integer=True
    )
    sessions = _Sessions(spec, seed)
    session_gap_s = 1.0 / (spec.rate_per_s / spec.turns_mean)  # sessions start at rate / turns
    requests: list[GenRequest] = []
    start, session, cutoff = 0.0, 0, math.inf
    while True:
        start += sessions.arrivals.exponential(session_gap_s)
        if len(requests) >= spec.requests:
            if start > cutoff:
                break
            if session % 64 == 0:
                arrivals = [r.arrival_s for r in requests]
                cutoff = float(np.partition(arrivals, spec.requests - 1)[spec.requests - 1])
        requests += sessions.requests(start, session)
        session += 1
    requests.sort(key=lambda r: r.arrival_s)
    return Workload(name, spec, seed, tuple(requests[: spec.requests]))


def generate_trace(
    preset: str | WorkloadSpec = "conversation", seed: int = 0, **overrides
) -> Trace:
    """A generated Mooncake-format trace (`generated=True`; `source` names generator, preset,
    seed)."""
    return generate_workload(preset, seed=seed, **overrides).to_trace()


# ----------------------------------------------------------------- plain synthetic workloads

POISSON = "poisson"
#: Length distributions a poisson workload can draw from: name -> (parameter names, numpy draw).
#: `lognormal(mean, sigma)` takes the mean of the lengths (not of their logarithm), as the
#: presets above do; every draw is rounded to a whole number of tokens, at least 1.
LENGTH_DISTRIBUTIONS = {
    "lognormal": (
        ("mean", "sigma"),
        lambda rng, n, mean, sigma: rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n),
    ),
    "exponential": (("mean",), lambda rng, n, mean: rng.exponential(mean, n)),
    "normal": (("mean", "std"), lambda rng, n, mean, std: rng.normal(mean, std, n)),
    "uniform": (
        ("low", "high"),
        lambda rng, n, low, high: rng.integers(int(low), int(high) + 1, n),
    ),
}
POISSON_FIELDS = ("rate", "prompt", "output", "requests", "seed", "shared", "prefix", "prefixes")
MAX_DRAWN_TOKENS = 10_000_000  # a longer draw is a typo or a runaway tail, not a workload
MAX_POISSON_REQUESTS = 1_000_000
#: Prompt blocks (hash ids) a generated workload may hold in all: about 0.4 GB of Python
#: ints. 1e4 prompts of 1e7 tokens (2e8 blocks) would take ~7 GB before anything runs; the
#: public conversation trace holds 0.3e6.
MAX_TRACE_BLOCKS = 10_000_000
#: The latest arrival a workload may have, in seconds (2^32 s, 136 years): a simulator's
#: float64 clock still resolves a microsecond there (2^32 x 2^-52 s), so a token gap of a
#: few milliseconds after such an arrival is not rounded away.
MAX_ARRIVAL_S = 2.0**32


@dataclass(frozen=True)
class PoissonSpec:
    """A plain synthetic workload: Poisson arrivals, lengths fixed or drawn; prompts unique,
    or opening with a prefix drawn from a pool (`shared`, `prefix`, `prefixes`)."""

    rate_per_s: float
    prompt: tuple  # (distribution name or "fixed", parameters...)
    output: tuple
    requests: int = 1000
    seed: int = 0
    #: share of each prompt drawn from the pool of common prefixes (None: no pool)
    shared: float | None = None
    #: length of each common prefix in tokens (None: as long as the share asks)
    prefix_tokens: int | None = None
    #: common prefixes in the pool, each request's drawn uniformly
    prefixes: int = 1

    @property
    def pooled(self) -> bool:
        return self.shared is not None or self.prefix_tokens is not None

    @property
    def text(self) -> str:
        def length(d):
            return str(d[1]) if d[0] == "fixed" else f"{d[0]}({','.join(f'{p:g}' for p in d[1:])})"

        text = (
            f"{POISSON}:rate={self.rate_per_s:g},prompt={length(self.prompt)},output={length(self.output)},"
            f"requests={self.requests},seed={self.seed}"
        )
        if self.shared is not None:
            text += f",shared={self.shared:g}"
        if self.prefix_tokens is not None:
            text += f",prefix={self.prefix_tokens}"
        if self.pooled:
            text += f",prefixes={self.prefixes}"
        return text


def _split_fields(text: str, body: str) -> list[str]:
    """'a=1,b=f(2,3)' -> ['a=1', 'b=f(2,3)']: commas inside parentheses stay."""
    fields, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            raise KvlabError(
                f"{text!r}: a ')' at character {len(text) - len(body) + i + 1} closes nothing"
            )
        if ch == "," and depth == 0:
            fields.append(body[start:i])
            start = i + 1
    if depth:
        raise KvlabError(f"{text!r}: a '(' is never closed")
    fields.append(body[start:])
    return fields


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise KvlabError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise KvlabError(f"{where}: {text.strip()!r} must be a finite number")
    return value


def _bounded(text: str, where: str, minimum: float, maximum: float, *, integer=False):
    """The number in `text`, within [minimum, maximum] (whole when `integer`); errors name
    `where`."""
    value = _number(text, where)
    return check_number(
        where, value, minimum=minimum, allow_equal_min=True, maximum=maximum, integer=integer
    )


def _length(text: str, where: str) -> tuple:
    """'1024' -> ('fixed', 1024); 'lognormal(1024,0.5)' -> ('lognormal', 1024.0, 0.5)."""
    text = text.strip()
    if "(" not in text:
        return ("fixed", _bounded(text, where, 1, MAX_DRAWN_TOKENS, integer=True))
    name, _, rest = text.partition("(")
    if not rest.endswith(")"):
        raise KvlabError(f"{where}: {text!r} lacks its closing parenthesis")
    if name not in LENGTH_DISTRIBUTIONS:
        raise KvlabError(
            f"{where}: unknown length distribution {name!r}; valid: a whole number, or "
            + ", ".join(f"{k}({', '.join(v[0])})" for k, v in LENGTH_DISTRIBUTIONS.items())
        )
    params, _ = LENGTH_DISTRIBUTIONS[name]
    values = [_number(v, where) for v in rest[:-1].split(",")] if rest[:-1].strip() else []
    if len(values) != len(params):
        raise KvlabError(f"{where}: {name} takes ({', '.join(params)}), got {len(values)} value(s)")
    for param, value in zip(params, values, strict=True):
        lowest = 1 if param in ("mean", "low", "high") else 0
        check_number(
            f"{where}: {name} {param}",
            value,
            minimum=lowest,
            allow_equal_min=True,
            maximum=MAX_DRAWN_TOKENS,
            integer=name == "uniform",
        )
    if name == "uniform" and values[0] > values[1]:
        raise KvlabError(f"{where}: uniform low ({values[0]:g}) is above high ({values[1]:g})")
    return (name, *values)


def parse_poisson(text: str) -> PoissonSpec:
    """Parse `poisson:rate=R,prompt=P,output=O[,requests=N][,seed=S][,shared=F][,prefix=T]
    [,prefixes=M]`; errors name the field."""
    body = text[len(POISSON) + 1 :] if text.startswith(POISSON + ":") else text
    given: dict[str, str] = {}
    for number, field in enumerate(_split_fields(text, body), start=1):
        where = f"{text!r} field {number} ({field.strip()!r})"
        key, eq, value = field.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise KvlabError(f"{where}: expected NAME=VALUE, e.g. rate=4")
        if key not in POISSON_FIELDS:
            raise KvlabError(f"{where}: unknown name {key!r}; valid: {', '.join(POISSON_FIELDS)}")
        if key in given:
            raise KvlabError(f"{where}: {key!r} is given twice")
        given[key] = value
    missing = [k for k in ("rate", "prompt", "output") if k not in given]
    if missing:
        raise KvlabError(
            f"{text!r}: missing {', '.join(missing)} (a poisson workload needs rate, prompt and "
            "output; requests and seed are optional)"
        )

    def where(key):
        return f"{text!r} field {list(given).index(key) + 1} ({key}={given[key]})"

    def field(key, minimum, maximum, default=None, *, integer=True):
        if key not in given:
            return default
        return _bounded(given[key], where(key), minimum, maximum, integer=integer)

    rate = check_number(where("rate"), _number(given["rate"], where("rate")), maximum=1e6)
    requests = field("requests", 1, MAX_POISSON_REQUESTS, 1000)
    seed = field("seed", 0, 2**63 - 1, 0)
    if requests > 1 and (requests - 1) / rate > MAX_ARRIVAL_S:
        raise KvlabError(
            f"{where('rate')}: {requests:,} requests at {rate:g}/s arrive over about "
            f"{(requests - 1) / rate:.3g} s, beyond {MAX_ARRIVAL_S:.3g} s (136 years), where a "
            "clock in seconds stops resolving token gaps; raise the rate or lower requests"
        )
    shared = field("shared", 0, 1, integer=False)
    prefix = field("prefix", 1, MAX_DRAWN_TOKENS)
    if "prefixes" in given and shared is None and prefix is None:
        raise KvlabError(f"{where('prefixes')}: a pool of prefixes needs shared=F or prefix=T")
    prefixes = field("prefixes", 1, MAX_POISSON_REQUESTS, 1)
    return PoissonSpec(
        rate,
        _length(given["prompt"], where("prompt")),
        _length(given["output"], where("output")),
        requests,
        seed,
        shared,
        prefix,
        prefixes,
    )


def _draw_lengths(rng, dist: tuple, n: int, what: str) -> np.ndarray:
    if dist[0] == "fixed":
        return np.full(n, dist[1], dtype=np.int64)
    _, draw = LENGTH_DISTRIBUTIONS[dist[0]]
    drawn = np.maximum(1, np.rint(draw(rng, n, *dist[1:])))
    if drawn.max() > MAX_DRAWN_TOKENS:
        raise KvlabError(
            f"{what} lengths drawn from {dist[0]}{tuple(dist[1:])} reach {drawn.max():,.0f} "
            "tokens, "
            f"beyond {MAX_DRAWN_TOKENS:,}; narrow the distribution"
        )
    return drawn.astype(np.int64)


def poisson_trace(spec: str | PoissonSpec, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """A seeded plain workload: the first request at 0 s, then exponential gaps of mean
    1/rate; prompt and output lengths fixed or drawn. The same text and seed give the same
    trace.

    Without `shared`/`prefix` every prompt is unique (a prefix cache never hits). With them,
    each prompt opens with the start of a common prefix drawn uniformly from a pool of
    `prefixes` (default 1), each `prefix` tokens long (default: as long as needed): the
    share `shared` (default 1) of the prompt, rounded to whole blocks (a prefix cache
    reuses whole blocks), at most `prefix` tokens and never the prompt's last token. The
    rest is unique. Block hash ids follow the traces' meaning: two prompts share their k-th
    id exactly when their first k blocks hold the same tokens, so a prefix cache hits on the
    shared part and only there. Examples: L-Eval-like (the Mooncake report's >80% cache
    ratio: long documents, many questions each) `prompt=19019,output=72,prefix=16384,
    prefixes=20`; the report's 50% simulated data `prompt=16384,output=512,shared=0.5`."""
    spec = parse_poisson(spec) if isinstance(spec, str) else spec
    arrivals_rng, prompt_rng, output_rng, pool_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(4)
    )
    n = spec.requests
    gaps = arrivals_rng.exponential(1.0 / spec.rate_per_s, n - 1)
    arrivals = np.concatenate(([0.0], np.cumsum(gaps)))
    if arrivals[-1] > MAX_ARRIVAL_S:
        raise KvlabError(
            f"{spec.text}: the last request arrives at {arrivals[-1]:.3g} s, beyond "
            f"{MAX_ARRIVAL_S:.3g} s; raise the rate or lower requests"
        )
    prompts = _draw_lengths(prompt_rng, spec.prompt, n, "prompt")
    outputs = _draw_lengths(output_rng, spec.output, n, "output")
    blocks = -(-prompts // block_tokens)
    check_trace_blocks(int(blocks.sum()), f"{spec.text}: {n:,} prompts")
    if spec.pooled:
        ids = _pooled_ids(spec, prompts, blocks, block_tokens, pool_rng)
    else:
        starts = np.concatenate(([0], np.cumsum(blocks[:-1])))
        ids = [tuple(range(int(s), int(s + b))) for s, b in zip(starts, blocks, strict=True)]
    requests = tuple(
        Request(float(t), int(p), int(o), h)
        for t, p, o, h in zip(arrivals, prompts, outputs, ids, strict=True)
    )
    return Trace(
        spec.text,
        requests,
        source=f"kvlab.traces.generate.poisson_trace ({spec.text})",
        generated=True,
        block_tokens=block_tokens,
    )


def check_trace_blocks(blocks: int, what: str) -> None:
    """Refuse a workload of more than MAX_TRACE_BLOCKS prompt blocks before building it."""
    if blocks > MAX_TRACE_BLOCKS:
        raise KvlabError(
            f"{what} hold {blocks:,} blocks of {BLOCK_TOKENS} tokens, beyond "
            f"{MAX_TRACE_BLOCKS:,} (about {MAX_TRACE_BLOCKS * 40 / 1e9:.1f} GB of hash ids); "
            "ask for fewer requests or shorter prompts"
        )


def shared_tokens(spec: PoissonSpec, prompts: np.ndarray, block_tokens: int) -> np.ndarray:
    """Tokens of each prompt taken from its common prefix (see `poisson_trace`)."""
    share = 1.0 if spec.shared is None else spec.shared
    want = np.rint(share * prompts / block_tokens).astype(np.int64) * block_tokens
    if spec.prefix_tokens is not None:
        want = np.minimum(want, spec.prefix_tokens)
    return np.clip(want, 0, prompts - 1)


def _pooled_ids(spec, prompts, blocks, block_tokens: int, rng) -> list[tuple]:
    """Hash ids with common prefixes: prefix j's k-th whole block has the same id in every
    prompt that holds it; every other block (the one where the prompt's own tokens start,
    and all after it) gets an id of its own."""
    shared = shared_tokens(spec, prompts, block_tokens)
    whole = shared // block_tokens  # blocks made only of the prefix's tokens
    pick = rng.integers(0, spec.prefixes, prompts.size)
    span = int(whole.max()) if whole.size else 0
    next_id = spec.prefixes * span  # prefix j's block k is j * span + k
    ids = []
    for j, w, b in zip(pick.tolist(), whole.tolist(), blocks.tolist(), strict=True):
        own = b - w
        ids.append(tuple(range(j * span, j * span + w)) + tuple(range(next_id, next_id + own)))
        next_id += own
    return ids
