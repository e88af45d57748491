"""MLAModelConfig against transformers' own classes: RoPE frequencies, YaRN attention factor and
softmax scale computed the same way; legacy rope_scaling keys; clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.checkpoint.config import ConfigError, MLAModelConfig
from mla_export.checkpoint.presets import tiny_config

ROPES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "yarn-v3": dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                    beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    "yarn-v2": dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                    beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
    "yarn-uneven": dict(rope_type="yarn", rope_theta=50000.0, factor=8.0, original_max_position_embeddings=512,
                        mscale=1.0, mscale_all_dim=0.5, truncate=False),
    "yarn-attention-factor": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                  original_max_position_embeddings=128, attention_factor=1.3, mscale_all_dim=1.0),
}


def _transformers(model_type, cfg):
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    if model_type == "deepseek_v3":
        config = DeepseekV3Config(**cfg)
        return config, DeepseekV3RotaryEmbedding(config), DeepseekV3Attention(config, 0)
    config = DeepseekV2Config(**cfg)
    return config, DeepseekV2RotaryEmbedding(config), DeepseekV2Attention(config, 0)


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_rope_and_scale_match_transformers(model_type, rope):
    cfg = tiny_config(model_type, rope_parameters=dict(ROPES[rope]), max_position_embeddings=8192)
    config, rotary, attn = _transformers(model_type, cfg)
    ours = MLAModelConfig.from_dict(config.to_dict())
    np.testing.assert_array_max_ulp(ours.rope.inv_freq(), rotary.inv_freq.numpy(), maxulp=1)
    assert ours.rope.cos_sin_scaling() == pytest.approx(rotary.attention_scaling, rel=1e-15)
    assert ours.softmax_scale == attn.scaling  # the same float operations, bit for bit


def test_legacy_rope_scaling_keys():
    new = dict(tiny_config("deepseek_v3", rope_parameters=dict(ROPES["yarn-v3"])), model_type="deepseek_v3")
    legacy = dict(new, rope_theta=10000.0, rope_scaling={k: v for k, v in ROPES["yarn-v3"].items()
                                                         if k not in ("rope_type", "rope_theta")} | {"type": "yarn"})
    del legacy["rope_parameters"]
    assert MLAModelConfig.from_dict(legacy).rope == MLAModelConfig.from_dict(new).rope


def test_facts_and_layer_kinds():
    cfg = MLAModelConfig.from_dict(dict(tiny_config("deepseek_v3", first_k_dense_replace=2), model_type="deepseek_v3"))
    assert [cfg.is_moe_layer(i) for i in range(3)] == [False, False, True]
    assert cfg.row_width == 48 and cfg.facts()["num_moe_layers"] == 1 and cfg.eos_token_ids == (1,)
    assert cfg.expanded_kv_bytes_per_token(2) == 3 * 4 * (32 + 16 + 24) * 2


@pytest.mark.parametrize("change,message", [
    (dict(model_type="mistral"), "unsupported model_type 'mistral'"),
    (dict(hidden_size=None), "lacks required key(s): hidden_size"),
    (dict(num_attention_heads=2.5), "num_attention_heads must be a positive integer"),
    (dict(qk_rope_head_dim=15), "qk_rope_head_dim must be even"),
    (dict(rope_parameters=dict(rope_type="llama3", rope_theta=1e4)), "rope_parameters.rope_type 'llama3' is not supported"),
    (dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4)), "(longrope) needs original_max_position_embeddings"),
    (dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4, original_max_position_embeddings=64,
                               short_factor=[1.0] * 3, long_factor=[1.0] * 8)), "rope short_factor must be 8 positive"),
    (dict(model_type="mistral_large4_text"), "DeepSeek Sparse Attention"),
    (dict(model_type="deepseek_v32", index_topk=0), "index_topk must be a positive integer"),
    (dict(model_type="deepseek_v32", q_lora_rank=None), "q_lora_rank must be set for DeepSeek Sparse Attention"),
    (dict(model_type="deepseek_v32", index_head_dim=8), "index_head_dim (8) must be at least qk_rope_head_dim"),
    (dict(model_type="glm_moe_dsa", indexer_types=["full"]), "indexer_types must be 3 entries"),
    (dict(model_type="glm_moe_dsa", indexer_types=["shared", "full", "full"]), "indexer_types[0] must be 'full'"),
    (dict(model_type="glm_moe_dsa", indexer_rope_interleave="yes"), "indexer_rope_interleave must be true or false"),
    (dict(model_type="kimi_linear"), "Kimi Delta Attention"),
    (dict(mlp_layer_types=["dense", "sparse"]), "mlp_layer_types must be a list of 3"),
    (dict(quantization_config=dict(quant_method="gptq", bits=4)), "quant_method='gptq'"),
    (dict(quantization_config=dict(quant_method="fp8", fmt="e4m3", weight_block_size=[128])), "weight_block_size"),
    (dict(n_routed_experts=6, n_group=4), "must be a multiple of n_group"),
    (dict(num_experts_per_tok=9), "exceeds the experts"),
    (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported for deepseek_v3"),
])
def test_errors(change, message):
    raw = dict(tiny_config("deepseek_v3"), model_type="deepseek_v3")
    raw.update(change)
    if raw.get("hidden_size", 1) is None:
        del raw["hidden_size"]
    with pytest.raises(ConfigError) as e:
        MLAModelConfig.from_dict(raw)
    assert message in str(e.value)
