"""Shapes of the toy decoder and its presets (tiny for tests, GB-sized for benchmarks).

A `DecoderConfig` is the decoder's own `ModelArgs` (gpt-fast) / `GPTConfig` (nanoGPT): a
frozen dataclass of shapes. It knows nothing about dtypes or placement; those belong to
the weights (`Decoder`) and to the cache (`KVCache`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import KvlabError, unknown_name

#: Dtypes the decoder can hold its KV cache in; int8 and fp8 carry one fp16 scale per
#: (token, KV head), i.e. per `head_dim` elements.
KV_DTYPES = ("fp32", "bf16", "fp16", "int8", "fp8")
#: Dtypes for the weights; int8 is weight-only (one scale per output row, activations
#: stay in the compute dtype).
WEIGHT_DTYPES = ("fp32", "bf16", "fp16", "int8")
PLACEMENTS = ("device", "host")
#: Upper bound on a KV cache's batch and tokens per sequence: a sanity limit far above what
#: any memory holds (the memory check refuses most caches long before it).
MAX_TOKENS = 100_000_000


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    name: str = "custom"
    vocab_size: int = 32000
    num_layers: int = 8
    hidden_size: int = 2048
    num_heads: int = 16  # query heads
    num_kv_heads: int = 4  # K/V heads; num_heads must be a multiple
    head_dim: int = 128
    intermediate_size: int = 5632  # SwiGLU width (gate and up projections each)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for key in (
            "vocab_size",
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
                raise KvlabError(
                    f"decoder config: {key} must be a whole number in 1..1e6, got {value!r}"
                )
        if self.num_heads % self.num_kv_heads:
            raise KvlabError(
                f"decoder config: num_heads ({self.num_heads}) must be a multiple "
                f"of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise KvlabError(f"decoder config: head_dim must be even for RoPE, got {self.head_dim}")
        if not (self.rope_theta > 1 and 0 < self.norm_eps < 1):
            raise KvlabError("decoder config: rope_theta must be > 1 and norm_eps in (0, 1)")

    @property
    def group_size(self) -> int:
        """Query heads that share one K/V head."""
        return self.num_heads // self.num_kv_heads

    def to_hf_config(self) -> dict:
        """The same shapes as a Hugging Face `config.json` (untied LM head, no biases)."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "_kvlab": {
                "display_name": f"kvlab toy decoder ({self.name})",
                "source": "kvlab.decoder.DecoderConfig",
            },
        }

    def to_dict(self) -> dict:
        return asdict(self)


#: Sizes: `tiny` runs the correctness tests in milliseconds; `cpu-bench` (~0.85 GB of
#: bf16 weights, 26x a 32 MiB last-level cache) and `gpu-bench` (~7 GB) are
#: Llama-shaped and big enough that a step streams from DRAM/HBM; `mha-small` has one
#: K/V head per query head, so its KV per token is large against its weights: the shape
#: where fetching cached KV can lose to recomputing it.
PRESETS: dict[str, DecoderConfig] = {
    "tiny": DecoderConfig(
        "tiny",
        vocab_size=256,
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=160,
    ),
    "small": DecoderConfig(
        "small",
        vocab_size=4096,
        num_layers=4,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=1408,
    ),
    "cpu-bench": DecoderConfig(
        "cpu-bench",
        vocab_size=32000,
        num_layers=8,
        hidden_size=2048,
        num_heads=16,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=5632,
    ),
    "gpu-bench": DecoderConfig(
        "gpu-bench",
        vocab_size=32000,
        num_layers=16,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
    ),
    "mha-small": DecoderConfig(
        "mha-small",
        vocab_size=32000,
        num_layers=16,
        hidden_size=1024,
        num_heads=16,
        num_kv_heads=16,
        head_dim=64,
        intermediate_size=2816,
    ),
}


def get_config(name: str | DecoderConfig) -> DecoderConfig:
    """A preset by name; unknown names raise with the list of valid ones."""
    if isinstance(name, DecoderConfig):
        return name
    found = PRESETS.get(str(name).lower())
    if found is None:
        raise unknown_name("decoder preset", name, PRESETS)
    return found


def check_choice(kind: str, value: str, valid: tuple[str, ...]) -> str:
    value = str(value).lower()
    if value not in valid:
        raise unknown_name(kind, value, valid)
    return value
