"""Model shapes, from the package catalogue or any Hugging Face style config.json.

A `ModelSpec` holds the shapes the ledger needs; parameter counts are derived from them
(`ParameterCounts`), so a new config needs no hand-typed size. Covered: dense, GQA/MQA,
an explicit `head_dim`, tied or untied embeddings, sliding windows, MoE in the Mixtral,
Qwen-MoE and DeepSeek styles, and MLA (DeepSeek's compressed latent KV).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
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
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "phi3",
}
#: Families with a bias on the q, k and v projections (but not o).
QKV_BIAS = {"qwen2", "qwen2_moe"}


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

    @property
    def params(self) -> "ParameterCounts":
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
    return ParameterCounts(float(total), float(embedding), float(streamed_dense), float(expert), moe_layers)


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
    return params


def expected_experts_touched(num_experts: int, experts_per_token: int, batch_tokens):
    """Expected distinct experts a batch touches in one MoE layer (uniform routing).

    Each token picks k of E experts; an expert stays untouched with probability
    (1 - k/E)^B, so E(1 - (1 - k/E)^B) are read. Real routers are skewed, which
    touches fewer; uniform is the bandwidth-pessimistic case.
    """
    batch_tokens = np.asarray(batch_tokens, dtype=float)
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** batch_tokens)


# --------------------------------------------------------------------------- loading

_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}


def _int(cfg: dict, key: str, where: str, default=None, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise KvlabError(f"{where}: {key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise KvlabError(f"{where}: {key} must be a whole number, got {value!r}")
    if value < minimum or value > 1e9:
        raise KvlabError(f"{where}: {key} must be between {minimum} and 1e9, got {value!r}")
    return int(value)


def _first(cfg: dict, keys: tuple[str, ...]):
    for key in keys:
        if cfg.get(key) is not None:
            return key
    return None


def spec_from_config(cfg: dict, name: str = "custom", where: str = "config") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (validated, with clear errors)."""
    if not isinstance(cfg, dict):
        raise KvlabError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    meta = cfg.get("_kvlab", {})
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM here
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    missing = [main for main, keys in _KEYS.items() if _first(cfg, keys) is None]
    if missing:
        wanted = ", ".join(_KEYS[m][0] for m in missing)
        raise KvlabError(f"{where}: not a usable model config, missing {wanted}")
    get = {k: _int(cfg, _first(cfg, keys), where) for k, keys in _KEYS.items()}
    layers, hidden, heads = get["num_layers"], get["hidden_size"], get["num_heads"]
    model_type = str(cfg.get("model_type", ""))
    kv_heads = _int(cfg, "num_key_value_heads", where, default=1 if cfg.get("multi_query") else heads)
    if heads % kv_heads:
        raise KvlabError(f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})")
    if cfg.get("head_dim") is not None:
        head_dim = _int(cfg, "head_dim", where)
    elif hidden % heads:
        raise KvlabError(f"{where}: hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}); give head_dim")
    else:
        head_dim = hidden // heads
    inter_key = _first(cfg, ("intermediate_size", "n_inner", "ffn_dim"))
    intermediate = _int(cfg, inter_key, where) if inter_key else 4 * hidden
    tied = cfg.get("tie_word_embeddings", model_type not in UNTIED_BY_DEFAULT)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    fields = dict(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=get["vocab_size"],
        intermediate_size=intermediate,
        tie_word_embeddings=bool(tied),
        gated_mlp=model_type not in NON_GATED_MLP,
        qkv_bias=bool(cfg.get("attention_bias")) or model_type in QKV_BIAS,
        sliding_window=_int(cfg, "sliding_window", where) if window else None,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        display_name=meta.get("display_name", name),
        source=meta.get("source", where),
    )
    if cfg.get("kv_lora_rank"):
        fields.update(
            kv_lora_rank=_int(cfg, "kv_lora_rank", where),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", where),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", where),
            v_head_dim=_int(cfg, "v_head_dim", where),
            q_lora_rank=_int(cfg, "q_lora_rank", where, default=0, minimum=0),
        )
    fields.update(_moe_fields(cfg, layers, intermediate, where))
    if "num_parameters" in meta:
        fields["num_parameters_override"] = float(meta["num_parameters"])
    return ModelSpec(**fields)


def _moe_fields(cfg: dict, layers: int, intermediate: int, where: str) -> dict:
    """MoE shapes in the Mixtral (num_local_experts), Qwen-MoE and DeepSeek styles."""
    key = _first(cfg, ("num_local_experts", "n_routed_experts", "num_experts"))
    if key is None or not cfg.get(key):
        return {}
    experts = _int(cfg, key, where)
    per_token = _int(cfg, "num_experts_per_tok", where)
    if per_token > experts:
        raise KvlabError(f"{where}: num_experts_per_tok ({per_token}) exceeds {key} ({experts})")
    expert_width = _int(cfg, "moe_intermediate_size", where, default=intermediate)
    shared_width = 0
    if cfg.get("n_shared_experts"):  # DeepSeek: n shared experts of the expert width
        shared_width = _int(cfg, "n_shared_experts", where) * expert_width
    elif cfg.get("shared_expert_intermediate_size"):  # Qwen-MoE: one wide shared expert
        shared_width = _int(cfg, "shared_expert_intermediate_size", where)
    first_dense = _int(cfg, "first_k_dense_replace", where, default=0, minimum=0)
    freq = _int(cfg, "moe_layer_freq", where, default=1)
    step = _int(cfg, "decoder_sparse_step", where, default=1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    indices = tuple(
        i for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )
    return dict(
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=expert_width,
        num_shared_experts=_int(cfg, "n_shared_experts", where, default=0, minimum=0),
        shared_expert_intermediate_size=shared_width,
        moe_layer_indices=indices,
    )


def load_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Load a Hugging Face style config.json (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise KvlabError(f"model config {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"cannot read model config {str(path)!r}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise KvlabError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return spec_from_config(cfg, name=name or path.parent.name or path.stem, where=str(path))


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, ModelSpec]:
    folder = resources.files("kvlab").joinpath("data/models")
    specs = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".json"):
            name = entry.name[: -len(".json")]
            specs[name] = spec_from_config(json.loads(entry.read_text()), name=name, where=f"catalogue {name}")
    return dict(sorted(specs.items()))


def models() -> dict[str, ModelSpec]:
    """All catalogued models by name."""
    return dict(_catalogue())


def get_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A model by catalogue name, or from a config.json path; unknown names list the valid ones."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    text = str(name_or_path)
    if text.lower() in _catalogue():
        return _catalogue()[text.lower()]
    if text.endswith(".json") or "/" in text or Path(text).exists():
        return load_config(text)
    raise unknown_name("model", text, _catalogue(), also="a path to a config.json")


def describe_params(n: float) -> str:
    """12.9e9 -> '12.9B' for tables."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}" if math.isfinite(n) else "n/a"
