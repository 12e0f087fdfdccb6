"""Model shapes, from the package catalogue or any Hugging Face style config.json.

A `ModelSpec` holds the shapes the ledger needs; parameter counts are derived from them
(`ParameterCounts`), so a new config needs no hand-typed size. Covered: dense, GQA/MQA,
an explicit `head_dim`, tied or untied embeddings, sliding windows, MoE in the Mixtral,
Qwen-MoE and DeepSeek styles, and MLA (DeepSeek's compressed latent KV).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import KvlabError, unknown_name

#: Model families whose MLP is a plain two-matrix FFN; every other family is gated
#: (SwiGLU / GeGLU: gate, up and down projections).
NON_GATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode"}
#: Families whose HF config class defaults `tie_word_embeddings` to False when the key is
#: absent; transformers' base class defaults it to True.
UNTIED_BY_DEFAULT = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "phi3",
}
#: Families with a bias on the q, k and v projections (but not o).
QKV_BIAS = {"qwen2", "qwen2_moe"}
#: Families that RMS-normalise each query and key head (a head_dim weight each, per layer).
QK_NORM = {"qwen3", "qwen3_moe"}


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only transformer that the byte and FLOP ledger needs."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int  # K/V heads: = num_heads for MHA, 1 for MQA, between for GQA
    head_dim: int
    vocab_size: int
    intermediate_size: int  # dense MLP width (for Mixtral-style MoE: each expert's)
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None  # attention span in tokens, None = full context
    max_position_embeddings: int | None = None
    # MLA (DeepSeek-V2/V3): KV cached as one latent of kv_lora_rank + a shared RoPE key.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # MoE: routed experts (0 = dense), experts each token picks, always-on shared experts.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layer_indices: tuple[int, ...] = ()
    num_parameters_override: float | None = None  # stated, not derived (the article's 7B)
    display_name: str = ""
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_elements_per_token(self) -> int:
        """Cached K/V elements per token over all layers (multiply by bytes/element).

        GQA/MHA/MQA: K and V, each kv_heads x head_dim, in every layer.
        MLA: one compressed latent (kv_lora_rank) plus the shared RoPE key per layer.
        """
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def attention_flops_per_cached_token(self) -> float:
        """FLOPs one new query token spends on one earlier position, over all layers.

        Scores q.k and the weighted sum p.v each cost 2 FLOPs per element per head.
        MLA with absorbed projections attends over the latent (kv_lora_rank + rope) for
        scores and the latent (kv_lora_rank) for values.
        """
        if self.is_mla:
            per_layer = 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            per_layer = 4 * self.num_heads * self.head_dim
        return float(per_layer * self.num_layers)

    @cached_property
    def params(self) -> "ParameterCounts":
        """Derived once per spec (the ledger asks for it on every call)."""
        return parameter_counts(self)

    def effective_context(self, context):
        """Tokens of KV a step attends over: the context, capped by a sliding window."""
        if self.sliding_window:
            return np.minimum(context, self.sliding_window)
        return context


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters by role. `streamed_dense` is read by every decode step whatever the
    batch; `expert` is one routed expert in one MoE layer; `embedding` is the input table,
    which a step only gathers a few rows of and so does not stream."""

    total: float
    embedding: float
    streamed_dense: float
    expert: float
    moe_layers: int

    def active_per_token(self, experts_per_token: int) -> float:
        """Parameters that one token multiplies by (FLOPs = 2 x this)."""
        return self.streamed_dense + self.moe_layers * experts_per_token * self.expert


def parameter_counts(m: ModelSpec) -> ParameterCounts:
    """Derive parameter counts from the shapes (biases and norms included)."""
    if m.num_parameters_override is not None:
        n = float(m.num_parameters_override)
        return ParameterCounts(total=n, embedding=0.0, streamed_dense=n, expert=0.0, moe_layers=0)
    h, layers = m.hidden_size, m.num_layers
    embedding = m.vocab_size * h
    lm_head = 0 if m.tie_word_embeddings else m.vocab_size * h
    attention = _attention_params(m) * layers
    norms = 2 * h * layers + h
    mlp_matrices = 3 if m.gated_mlp else 2
    moe_layers = len(m.moe_layer_indices) if m.is_moe else 0
    dense_mlp = (layers - moe_layers) * mlp_matrices * h * m.intermediate_size
    expert = mlp_matrices * h * m.expert_intermediate_size if m.is_moe else 0
    shared = moe_layers * mlp_matrices * h * m.shared_expert_intermediate_size
    router = moe_layers * m.num_experts * h
    streamed_dense = lm_head + attention + norms + dense_mlp + shared + router
    total = embedding + streamed_dense + moe_layers * m.num_experts * expert
    return ParameterCounts(
        float(total), float(embedding), float(streamed_dense), float(expert), moe_layers
    )


def _attention_params(m: ModelSpec) -> int:
    """Attention parameters of one layer (projections, MLA's low-rank norms, biases)."""
    h, heads = m.hidden_size, m.num_heads
    if m.is_mla:
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk_head
        else:
            q = h * heads * qk_head
        kv = (
            h * (m.kv_lora_rank + m.qk_rope_head_dim)
            + m.kv_lora_rank
            + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        )
        return q + kv + heads * m.v_head_dim * h
    q_out, kv_out = heads * m.head_dim, m.num_kv_heads * m.head_dim
    params = h * q_out + 2 * h * kv_out + q_out * h
    if m.qkv_bias:
        params += q_out + 2 * kv_out
    if m.qk_norm:
        params += 2 * m.head_dim
    return params


# --------------------------------------------------------------------------- loading

#: A real config.json is a few kB; reading stops here (`--model /dev/zero` ends at once).
MAX_CONFIG_BYTES = 16 * 2**20
#: Any shape beyond this is a typo, not a model (1e9 layers, heads or widths).
MAX_SHAPE = 10**9
#: A stated parameter count beyond this is a typo (1000x the largest published model).
MAX_PARAMETERS = 1e15

_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}


def _show(value) -> str:
    """A value for an error message, cut short (a hostile file can hold a megabyte string)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return _clip(repr(value))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Config:
    """A config dict read the Hugging Face way: a key set to null is a key not given."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def get(self, key: str, default=None):
        value = self.cfg.get(key)
        return default if value is None else value

    def first(self, keys: tuple[str, ...]) -> str | None:
        return next((key for key in keys if self.cfg.get(key) is not None), None)

    def whole(self, key: str, default=None, minimum: int = 1) -> int:
        """A whole number within [minimum, 1e9]; `default` when absent or null."""
        value = self.get(key, default)
        if value is None:
            raise KvlabError(f"{self.where}: {key} is missing")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer())
        ):
            raise KvlabError(f"{self.where}: {key} must be a whole number, got {_show(value)}")
        if not minimum <= value <= MAX_SHAPE:
            raise KvlabError(
                f"{self.where}: {key} must be between {minimum} and 1e9, got {_show(value)}"
            )
        return int(value)

    def optional_whole(self, key: str, minimum: int = 1) -> int | None:
        return None if self.cfg.get(key) is None else self.whole(key, minimum=minimum)

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean (the string "false" is not one: it would read as true)."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise KvlabError(f"{self.where}: {key} must be true or false, got {_show(value)}")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise KvlabError(f"{self.where}: {key} must be a string, got {_show(value)}")
        return value


def _language_model(cfg: dict, where: str) -> dict:
    """Multimodal wrappers keep the language model's shapes under `text_config`."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, dict):
        raise KvlabError(f"{where}: text_config must be a JSON object, got {_show(text)}")
    return {**text, "model_type": text.get("model_type") or cfg.get("model_type")}


def _metadata(cfg: dict, where: str) -> dict:
    """kvlab's own `_kvlab` block: display_name, source, and a stated num_parameters."""
    meta = cfg.get("_kvlab")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise KvlabError(f"{where}: _kvlab must be a JSON object, got {_show(meta)}")
    c = _Config(meta, f"{where}: _kvlab")
    out = {"display_name": c.text("display_name", ""), "source": c.text("source", "")}
    n = meta.get("num_parameters")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 < n <= MAX_PARAMETERS:
            raise KvlabError(
                f"{where}: _kvlab.num_parameters must be a parameter count > 0 and "
                f"<= 1e15, got {_show(n)}"
            )
        out["num_parameters"] = float(n)
    return out


def spec_from_config(cfg: dict, name: str = "custom", where: str = "config") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (validated, with clear errors).

    As in transformers, a key set to null means the key is absent (DeepSeek-V2-Lite's
    `"q_lora_rank": null`: no query compression)."""
    if not isinstance(cfg, dict):
        raise KvlabError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    meta = _metadata(cfg, where)
    c = _Config(_language_model(cfg, where), where)
    missing = [main for main, keys in _KEYS.items() if c.first(keys) is None]
    if missing:
        wanted = ", ".join(_KEYS[m][0] for m in missing)
        raise KvlabError(f"{where}: not a usable model config, missing {wanted}")
    get = {k: c.whole(c.first(keys)) for k, keys in _KEYS.items()}
    layers, hidden, heads = get["num_layers"], get["hidden_size"], get["num_heads"]
    model_type = c.text("model_type")
    kv_heads = c.whole("num_key_value_heads", 1 if c.flag("multi_query", False) else heads)
    if heads % kv_heads:
        raise KvlabError(
            f"{where}: num_attention_heads ({heads}) is not a multiple of "
            f"num_key_value_heads ({kv_heads})"
        )
    head_dim = c.optional_whole("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise KvlabError(
                f"{where}: hidden_size ({hidden}) is not divisible by "
                f"num_attention_heads ({heads}); give head_dim"
            )
        head_dim = hidden // heads
    inter_key = c.first(("intermediate_size", "n_inner", "ffn_dim"))
    intermediate = c.whole(inter_key) if inter_key else 4 * hidden
    window = c.optional_whole("sliding_window", minimum=0)
    fields = dict(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=get["vocab_size"],
        intermediate_size=intermediate,
        tie_word_embeddings=c.flag("tie_word_embeddings", model_type not in UNTIED_BY_DEFAULT),
        gated_mlp=model_type not in NON_GATED_MLP,
        qkv_bias=c.flag("attention_bias", False) or model_type in QKV_BIAS,
        qk_norm=model_type in QK_NORM,
        sliding_window=(window or None) if c.flag("use_sliding_window", True) else None,
        max_position_embeddings=c.optional_whole("max_position_embeddings"),
        display_name=meta.get("display_name") or name,
        source=meta.get("source") or where,
        num_parameters_override=meta.get("num_parameters"),
    )
    fields.update(_mla_fields(c))
    fields.update(_moe_fields(c, layers, intermediate))
    return ModelSpec(**fields)


def _mla_fields(c: _Config) -> dict:
    """MLA (DeepSeek-V2/V3): a compressed KV latent; the query is compressed only when
    q_lora_rank is given (V2-Lite has none)."""
    if not c.whole("kv_lora_rank", 0, minimum=0):
        return {}
    return dict(
        kv_lora_rank=c.whole("kv_lora_rank"),
        qk_rope_head_dim=c.whole("qk_rope_head_dim"),
        qk_nope_head_dim=c.whole("qk_nope_head_dim"),
        v_head_dim=c.whole("v_head_dim"),
        q_lora_rank=c.whole("q_lora_rank", 0, minimum=0),
    )


def _dense_only_layers(c: _Config) -> set[int]:
    """Qwen-MoE's `mlp_only_layers`: layer numbers that keep a dense MLP."""
    value = c.get("mlp_only_layers", [])
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise KvlabError(
            f"{c.where}: mlp_only_layers must be a list of layer numbers, got {_show(value)}"
        )
    return set(value)


def _moe_fields(c: _Config, layers: int, intermediate: int) -> dict:
    """MoE shapes in the Mixtral (num_local_experts), Qwen-MoE and DeepSeek styles."""
    key = c.first(("num_local_experts", "n_routed_experts", "num_experts"))
    experts = c.whole(key, minimum=0) if key else 0
    if not experts:
        return {}
    per_token = c.whole("num_experts_per_tok")
    if per_token > experts:
        raise KvlabError(f"{c.where}: num_experts_per_tok ({per_token}) exceeds {key} ({experts})")
    expert_width = c.whole("moe_intermediate_size", intermediate)
    shared = c.whole("n_shared_experts", 0, minimum=0)
    if shared:  # DeepSeek: n shared experts of the expert width
        shared_width = shared * expert_width
    else:  # Qwen-MoE: one wide shared expert (or none)
        shared_width = c.whole("shared_expert_intermediate_size", 0, minimum=0)
    first_dense = c.whole("first_k_dense_replace", 0, minimum=0)
    freq = c.whole("moe_layer_freq", 1)
    step = c.whole("decoder_sparse_step", 1)
    dense_only = _dense_only_layers(c)
    indices = tuple(
        i
        for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )
    return dict(
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=expert_width,
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_width,
        moe_layer_indices=indices,
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a float")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def parse_json(data: bytes, where: str):
    """Parse a JSON document strictly: no NaN/Infinity, no overflowing numbers, bounded
    nesting; every failure is a KvlabError that names the file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KvlabError(f"{where}: not UTF-8 text") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise KvlabError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise KvlabError(f"{where}: nested too deeply to be a config") from None
    except ValueError as exc:  # NaN, 1e400, an integer of more than 4300 digits
        raise KvlabError(f"{where}: not valid JSON ({exc})") from None


_LOADED: dict[tuple, ModelSpec] = {}


def _file_key(st: os.stat_result, name: str | None) -> tuple:
    """Identity of a config file: a regular file by its contents' version, anything else
    (a pipe, `--model <(cat config.json)`) by itself, since it can be read only once."""
    if stat.S_ISREG(st.st_mode):
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, name)
    return (st.st_dev, st.st_ino, name)


def _read_limited(path: Path) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise KvlabError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not a model config")
    return data


def load_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Load a Hugging Face style config.json (or a folder holding one).

    Each file is read once per process (a pipe can be read only once); a regular file is
    read again when it changes."""
    path = Path(path)
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            path = path / "config.json"
            st = path.stat()
        key = _file_key(st, name)
        if key not in _LOADED:
            spec = spec_from_config(
                parse_json(_read_limited(path), str(path)),
                name=name or _default_name(path),
                where=str(path),
            )
            if len(_LOADED) >= 32:
                _LOADED.clear()
            _LOADED[key] = spec
        return _LOADED[key]
    except (FileNotFoundError, NotADirectoryError):
        raise KvlabError(f"model config {_show(str(path))} does not exist") from None
    except OSError as exc:
        raise KvlabError(
            f"cannot read model config {_show(str(path))}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:  # a NUL byte in the path
        if isinstance(exc, KvlabError):
            raise
        raise KvlabError(f"model config {_show(str(path))} is not a usable path ({exc})") from None


def _default_name(path: Path) -> str:
    """A Hugging Face checkout names the model by its folder; any other file by its stem."""
    return (path.parent.name if path.name == "config.json" else path.stem) or "custom"


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, ModelSpec]:
    folder = resources.files("kvlab").joinpath("data/models")
    specs = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".json"):
            name = entry.name[: -len(".json")]
            where = f"catalogue {name}"
            cfg = parse_json(entry.read_bytes(), where)
            specs[name] = spec_from_config(cfg, name=name, where=where)
    return dict(sorted(specs.items()))


def models() -> dict[str, ModelSpec]:
    """All catalogued models by name."""
    return dict(_catalogue())


def _is_path(text: str) -> bool:
    if text.endswith(".json") or "/" in text or os.sep in text:
        return True
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name longer than the file system allows, a NUL byte
        return False


def get_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A model by catalogue name, or from a config.json path; unknown names list the valid ones."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    text = str(name_or_path)
    if text.lower() in _catalogue():
        return _catalogue()[text.lower()]
    if text.strip() and _is_path(text):
        return load_config(text)
    raise unknown_name("model", _clip(text), _catalogue(), also="a path to a config.json")


def describe_params(n: float) -> str:
    """12.9e9 -> '12.9B' for tables."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}" if math.isfinite(n) else "n/a"
