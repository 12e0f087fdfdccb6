"""Model catalogue and config.json loading: parameter counts derived from shapes."""

import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.models import MAX_CONFIG_BYTES, get_model, load_config, models, spec_from_config

ROOT = Path(__file__).resolve().parents[1]

# Published parameter counts (model cards / technical reports).
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b": 7_248_023_552,
    "qwen2.5-7b": 7_615_616_512,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_parameter_count_matches_published(name, count):
    assert get_model(name).params.total == count


def test_deepseek_v3_total_and_active():
    p = get_model("deepseek-v3").params
    assert p.total == pytest.approx(671e9, rel=0.002)
    active = p.active_per_token(8) + p.embedding  # the report counts the embedding
    assert active == pytest.approx(37e9, rel=0.02)


def test_mixtral_active_is_12_9b_with_embedding():
    m = get_model("mixtral-8x7b")
    assert m.params.active_per_token(2) + m.params.embedding == pytest.approx(12.9e9, rel=0.01)


def test_kv_elements_gqa_mha_mla():
    assert get_model("llama-3.1-8b").kv_elements_per_token == 2 * 32 * 8 * 128
    assert get_model("llama-2-7b").kv_elements_per_token == 2 * 32 * 32 * 128
    assert get_model("qwen2.5-7b").kv_elements_per_token == 2 * 28 * 4 * 128
    assert get_model("deepseek-v3").kv_elements_per_token == (512 + 64) * 61
    # DeepSeek-V2-Lite: 31,104 bytes per token in fp16, against the article 7B's 131,072
    assert get_model("deepseek-v2-lite").kv_elements_per_token * 2 == 31_104


def test_catalogue_has_the_nine_models():
    assert set(models()) == {
        "article-7b",
        "llama-2-7b",
        "llama-3.1-8b",
        "mistral-7b",
        "qwen2.5-7b",
        "llama-3.1-70b",
        "mixtral-8x7b",
        "deepseek-v2-lite",
        "deepseek-v3",
    }
    assert all(m.source for m in models().values())


def _write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


BASE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def test_mqa_and_explicit_head_dim(tmp_path):
    m = load_config(_write(tmp_path, {**BASE, "num_key_value_heads": 1, "head_dim": 32}))
    assert m.num_kv_heads == 1 and m.head_dim == 32
    assert m.kv_elements_per_token == 2 * 2 * 1 * 32
    # q: 64 x 128, k/v: 64 x 32 each, o: 128 x 64 -> per layer 20480 attention params
    mlp = 3 * 64 * 128
    expected = 100 * 64 * 2 + 2 * (64 * 128 + 2 * 64 * 32 + 128 * 64 + mlp + 2 * 64) + 64
    assert m.params.total == expected


def test_tied_embeddings_default_by_family(tmp_path):
    untied = load_config(_write(tmp_path, BASE))
    tied = load_config(_write(tmp_path, {**BASE, "tie_word_embeddings": True}))
    assert untied.params.total - tied.params.total == 100 * 64
    unknown_family = load_config(_write(tmp_path, {**BASE, "model_type": "newthing"}))
    assert unknown_family.tie_word_embeddings  # transformers' base default


def test_folder_and_text_config(tmp_path):
    _write(tmp_path, {"model_type": "llava", "text_config": BASE})
    assert load_config(tmp_path).num_layers == 2


def test_deepseek_style_moe_layers(tmp_path):
    cfg = {
        **BASE,
        "num_hidden_layers": 6,
        "n_routed_experts": 16,
        "n_shared_experts": 2,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 2,
        "moe_layer_freq": 2,
    }
    m = load_config(_write(tmp_path, cfg))
    assert m.moe_layer_indices == (2, 4)
    assert m.shared_expert_intermediate_size == 64


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"hidden_size": 64}, "missing num_hidden_layers"),
        ({**BASE, "num_key_value_heads": 3}, "not a multiple"),
        ({**BASE, "hidden_size": 65}, "give head_dim"),
        ({**BASE, "num_hidden_layers": -2}, "between 1"),
        ({**BASE, "num_hidden_layers": "32"}, "whole number"),
        ({**BASE, "num_local_experts": 4, "num_experts_per_tok": 8}, "exceeds"),
        ([1, 2], "JSON object"),
    ],
)
def test_malformed_configs_raise_clearly(tmp_path, cfg, message):
    with pytest.raises(KvlabError, match=message):
        load_config(_write(tmp_path, cfg))


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(KvlabError, match="not valid JSON"):
        load_config(bad)
    with pytest.raises(KvlabError, match="does not exist"):
        load_config(tmp_path / "nope.json")


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KvlabError, match="llama-3.1-8b"):
        get_model("llama-3.1-8")


# ------------------------------------------------------------------ published config.json files

CONFIGS = ROOT / "tests" / "data" / "configs"


def published(name):
    return load_config(CONFIGS / name / "config.json")


def test_deepseek_v2_lite_null_q_lora_rank_means_no_query_compression():
    """The published config says `"q_lora_rank": null`; as in transformers, null means absent."""
    m = published("deepseek-ai--DeepSeek-V2-Lite-Chat")
    assert m.is_mla and m.q_lora_rank == 0 and m.kv_lora_rank == 512
    assert m.kv_elements_per_token == (512 + 64) * 27
    # the checkpoint's safetensors index: 31,412,968,448 bytes of bf16
    assert m.params.total == 31_412_968_448 // 2
    assert m.moe_layer_indices == tuple(range(1, 27))  # all but the first layer
    active = m.params.active_per_token(m.experts_per_token)
    assert active == pytest.approx(2.4e9, rel=0.03)  # the model card


def test_deepseek_v3_config_mla_with_query_compression():
    m = published("deepseek-ai--DeepSeek-V3")
    assert m.q_lora_rank == 1536 and m.kv_elements_per_token == (512 + 64) * 61
    assert m.params == get_model("deepseek-v3").params  # the catalogue entry holds the same shapes
    assert m.params.total == pytest.approx(671e9, rel=0.002)


def test_mixtral_and_llama_configs_match_the_published_counts():
    assert published("mistralai--Mixtral-8x7B-v0.1").params.total == PUBLISHED["mixtral-8x7b"]
    llama = published("meta-llama--Meta-Llama-3.1-8B")
    assert llama.params.total == PUBLISHED["llama-3.1-8b"]
    assert (llama.num_kv_heads, llama.head_dim, llama.tie_word_embeddings) == (8, 128, False)


def test_qwen3_configs_explicit_head_dim_tied_and_qwen_moe():
    """Model cards: Qwen3-0.6B has 0.6B parameters, 0.44B without the (tied) embedding;
    Qwen3-30B-A3B 30.5B in total, 3.3B activated."""
    small = published("Qwen--Qwen3-0.6B")
    assert small.head_dim == 128 and small.num_kv_heads == 8 and small.tie_word_embeddings
    assert small.sliding_window is None  # "sliding_window": null
    assert round(small.params.total / 1e9, 1) == 0.6
    assert round((small.params.total - small.params.embedding) / 1e9, 2) == 0.44
    moe = published("Qwen--Qwen3-30B-A3B")
    assert moe.num_experts == 128 and moe.experts_per_token == 8
    assert len(moe.moe_layer_indices) == 48
    assert moe.shared_expert_intermediate_size == 0
    assert round(moe.params.total / 1e9, 1) == 30.5
    active = moe.params.active_per_token(8) + moe.params.embedding
    assert active == pytest.approx(3.3e9, rel=0.02)


def test_every_published_config_loads_through_the_cli(capsys):
    for folder in sorted(CONFIGS.iterdir()):
        if folder.is_dir():
            assert main(["budget", "--model", str(folder / "config.json"), "--json"]) == 0, folder
            assert json.loads(capsys.readouterr().out)["weight_bytes"] > 0


# ------------------------------------------------------------------ null, types, hostile files

MOE_MLA = {
    **BASE,
    "model_type": "deepseek_v2",
    "num_hidden_layers": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "q_lora_rank": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "sliding_window": 1024,
    "use_sliding_window": True,
    "max_position_embeddings": 4096,
    "attention_bias": False,
    "multi_query": False,
    "mlp_only_layers": [2],
    "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 64,
    "intermediate_size": 128,
    "_kvlab": {"display_name": "x"},
}


@pytest.mark.parametrize(
    "key",
    sorted(
        k
        for k in MOE_MLA
        if k not in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    ),
)
def test_null_means_absent_for_every_optional_field(tmp_path, key):
    """As in transformers, `"key": null` is the same config as no key at all (DeepSeek-V2-Lite
    publishes `"q_lora_rank": null`)."""

    def outcome(cfg):
        path = tmp_path / f"{len(cfg)}" / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(cfg))
        try:
            m = load_config(path, name="m")
        except KvlabError as exc:  # required here (an MoE needs num_experts_per_tok): same error
            return str(exc).split(": ", 1)[1]
        return dataclasses.replace(m, source=""), m.params

    absent = {k: v for k, v in MOE_MLA.items() if k != key}
    assert outcome({**MOE_MLA, key: None}) == outcome(absent)


def test_tie_word_embeddings_takes_json_booleans_only(tmp_path):
    with pytest.raises(KvlabError, match="tie_word_embeddings must be true or false, got 'false'"):
        load_config(_write(tmp_path, {**BASE, "tie_word_embeddings": "false"}))
    with pytest.raises(KvlabError, match="tie_word_embeddings must be true or false, got 0"):
        load_config(_write(tmp_path, {**BASE, "tie_word_embeddings": 0}))
    untied = load_config(_write(tmp_path, {**BASE, "tie_word_embeddings": False}))
    assert not untied.tie_word_embeddings


@pytest.mark.parametrize("num_parameters", [-7e9, 0, "7B", [7e9], True, 1e16])
def test_stated_parameter_count_must_be_positive_and_plausible(tmp_path, num_parameters):
    cfg = {**BASE, "_kvlab": {"num_parameters": num_parameters}}
    with pytest.raises(KvlabError, match="num_parameters must be a parameter count > 0"):
        load_config(_write(tmp_path, cfg))


def test_a_nan_parameter_count_from_the_api_is_refused():
    with pytest.raises(KvlabError, match="num_parameters"):
        spec_from_config({**BASE, "_kvlab": {"num_parameters": float("nan")}})


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"hidden_size": NaN}', "NaN is not a JSON number"),
        ('{"hidden_size": Infinity}', "Infinity is not a JSON number"),
        ('{"hidden_size": -Infinity}', "Infinity is not a JSON number"),
        ('{"hidden_size": 1e400}', "too large for a float"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
            '"vocab_size": 100, "_kvlab": [1]}',
            "_kvlab must be a JSON object",
        ),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
            '"vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 2, '
            '"mlp_only_layers": "0,1"}',
            "mlp_only_layers must be a list",
        ),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
            '"vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 2, '
            '"mlp_only_layers": [0.5]}',
            "mlp_only_layers must be a list",
        ),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
            '"vocab_size": 100, "text_config": "llama"}',
            "text_config must be a JSON object",
        ),
        (
            '{"num_hidden_layers": '
            + str(10**40)
            + ', "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}',
            "an integer of about 41 digits",
        ),
    ],
)
def test_hostile_config_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(KvlabError, match=message):
        load_config(path)


def test_a_piped_config_is_read_once(tmp_path):
    """`--model <(cat config.json)`: a pipe can be read only once; budget asks for the model
    three times (decode step, memory fit, prefill)."""

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(json.dumps(BASE)), daemon=True)
    writer.start()
    assert main(["budget", "--model", str(fifo), "--json"]) == 0
    writer.join(timeout=5)
    assert not writer.is_alive()


def test_names_longer_than_the_file_system_allows(capsys):
    for name in ("x" * 5000, "x" * 5000 + ".json", "/tmp/" + "y" * 300 + "/config.json", "a\0b"):
        assert main(["budget", "--model", name]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 600


def test_a_huge_file_is_refused_without_reading_it_all():
    with pytest.raises(KvlabError, match=f"larger than {MAX_CONFIG_BYTES // 2**20} MiB"):
        load_config("/dev/zero")
