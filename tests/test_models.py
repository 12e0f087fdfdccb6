"""Model catalogue and config.json loading: parameter counts derived from shapes."""
import json

import pytest

from kvlab.errors import KvlabError
from kvlab.models import expected_experts_touched, get_model, load_config, models

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


def test_catalogue_has_the_eight_models():
    assert set(models()) == {"article-7b", "llama-2-7b", "llama-3.1-8b", "mistral-7b",
                             "qwen2.5-7b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"}
    assert all(m.source for m in models().values())


def test_expected_experts_touched():
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts_touched(8, 2, 1000) == pytest.approx(8.0)
    # two tokens: 8 * (1 - (6/8)^2) = 3.5
    assert expected_experts_touched(8, 2, 2) == pytest.approx(3.5)


def _write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


BASE = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100}


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
    cfg = {**BASE, "num_hidden_layers": 6, "n_routed_experts": 16, "n_shared_experts": 2,
           "num_experts_per_tok": 4, "moe_intermediate_size": 32, "first_k_dense_replace": 2,
           "moe_layer_freq": 2}
    m = load_config(_write(tmp_path, cfg))
    assert m.moe_layer_indices == (2, 4)
    assert m.shared_expert_intermediate_size == 64


@pytest.mark.parametrize("cfg,message", [
    ({"hidden_size": 64}, "missing num_hidden_layers"),
    ({**BASE, "num_key_value_heads": 3}, "not a multiple"),
    ({**BASE, "hidden_size": 65}, "give head_dim"),
    ({**BASE, "num_hidden_layers": -2}, "between 1"),
    ({**BASE, "num_hidden_layers": "32"}, "whole number"),
    ({**BASE, "num_local_experts": 4, "num_experts_per_tok": 8}, "exceeds"),
    ([1, 2], "JSON object"),
])
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
