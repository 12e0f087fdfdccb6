"""`kvlab models` and `kvlab hardware`: what the catalogues hold, with sources."""

from __future__ import annotations

from ..cost import kv_bytes_per_token
from ..fmt import si
from ..hardware import devices, tiers
from ..models import describe_params, models
from .args import print_json, table


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model catalogue (shapes, parameters, KV per token)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_models)
    p = sub.add_parser("hardware", help="list devices, memory tiers and links")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_hardware)


def run_models(args) -> int:
    rows, out = [], {}
    for name, m in models().items():
        p = m.params
        kv = kv_bytes_per_token(m, "fp16")
        kind = ("MoE " if m.is_moe else "") + ("MLA" if m.is_mla else _attention_kind(m))
        out[name] = {
            "display_name": m.display_name,
            "parameters": p.total,
            "active_parameters": p.active_per_token(m.experts_per_token),
            "layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "query_heads": m.num_heads,
            # MLA caches one latent per token and layer, not K/V heads
            "kv_heads": None if m.is_mla else m.num_kv_heads,
            "head_dim": m.qk_nope_head_dim + m.qk_rope_head_dim if m.is_mla else m.head_dim,
            **(
                {"kv_latent_dim": m.kv_lora_rank, "kv_rope_dim": m.qk_rope_head_dim}
                if m.is_mla
                else {}
            ),
            "attention": kind,
            "kv_bytes_per_token_fp16": kv,
            "source": m.source,
        }
        heads, dims = _heads_and_dims(m)
        rows.append(
            [
                name,
                describe_params(p.total),
                describe_params(p.active_per_token(m.experts_per_token)),
                str(m.num_layers),
                heads,
                dims,
                kind,
                si(kv, "B"),
            ]
        )
    if args.json:
        print_json(out)
    else:
        print(
            table(
                rows,
                [
                    "model",
                    "params",
                    "active",
                    "layers",
                    "heads q/kv",
                    "head dim (KV cached)",
                    "attention",
                    "KV/token fp16",
                ],
            )
        )
    return 0


def _heads_and_dims(m) -> tuple[str, str]:
    """Query/KV heads and the head size, as cached: MLA caches a latent and a RoPE key."""
    if m.is_mla:
        return f"{m.num_heads}/latent", f"{m.kv_lora_rank}+{m.qk_rope_head_dim} rope"
    return f"{m.num_heads}/{m.num_kv_heads}", str(m.head_dim)


def _attention_kind(m) -> str:
    if m.num_kv_heads == m.num_heads:
        return "MHA"
    return "MQA" if m.num_kv_heads == 1 else "GQA"


def run_hardware(args) -> int:
    if args.json:
        print_json(
            {
                "devices": {n: {k: v for k, v in vars(d).items()} for n, d in devices().items()},
                "tiers": {n: {k: v for k, v in vars(t).items()} for n, t in tiers().items()},
            }
        )
        return 0
    rows = [
        [
            n,
            d.memory_type,
            si(d.capacity_bytes, "B"),
            si(d.memory_bandwidth_bytes_per_s, "B/s"),
            si(d.bf16_flops_per_s, "FLOP/s"),
            si(d.fp8_flops_per_s, "FLOP/s") if d.fp8_flops_per_s else "n/a",
        ]
        for n, d in devices().items()
    ]
    print(table(rows, ["device", "memory", "capacity", "bandwidth", "bf16 dense", "fp8 dense"]))
    print()
    rows = [
        [n, t.kind, si(t.bandwidth_bytes_per_s, "B/s"), t.derivation] for n, t in tiers().items()
    ]
    print(table(rows, ["tier", "kind", "per direction", "from the sold figure"]))
    return 0
