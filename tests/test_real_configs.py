"""The config.json files of published MLA checkpoints (tests/real_configs/, sources in its README),
read by MLAModelConfig and checked against transformers' own reading of the same file: its config
class (after __post_init__) for every geometry int, the dense/MoE pattern, the router and token
facts, and its rotary embedding / attention modules for the RoPE frequencies, the cos/sin factor
and the softmax scale. No model is instantiated; the rotary modules are built at the real dims."""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mla_export.checkpoint.config import ConfigError, MLAModelConfig

pytest.importorskip("transformers")
pytest.importorskip("torch")

HERE = Path(__file__).parent / "real_configs"

# file -> (transformers model_type that reads it, its modeling-file prefix)
SUPPORTED = {
    "deepseek-v2-lite-chat.json": ("deepseek_v2", "DeepseekV2"),
    "deepseek-v2.5.json": ("deepseek_v2", "DeepseekV2"),
    "deepseek-v3.json": ("deepseek_v3", "DeepseekV3"),
    "deepseek-r1.json": ("deepseek_v3", "DeepseekV3"),
    # Kimi K2's config.json points auto_map at DeepSeek-V3's code; transformers has no kimi_k2 class
    "kimi-k2-instruct.json": ("deepseek_v3", "DeepseekV3"),
    "glm-4.7-flash.json": ("glm4_moe_lite", "Glm4MoeLite"),
    "minicpm3-4b.json": ("minicpm3", "MiniCPM3"),
    # DeepSeek Sparse Attention
    "deepseek-v3.2.json": ("deepseek_v32", "DeepseekV32"),
    "glm-5.json": ("glm_moe_dsa", "GlmMoeDsa"),
}


def test_every_file_is_covered():
    on_disk = {p.name for p in HERE.glob("*.json")}
    assert on_disk == set(SUPPORTED)


def _raw(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def _hf_config(name: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = SUPPORTED[name][0]
    raw = dict(_raw(name), model_type=model_type)
    return CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(raw))  # as from_pretrained reads it


def _modeling(name: str):
    model_type, prefix = SUPPORTED[name]
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}"), prefix


@pytest.mark.parametrize("name", ["deepseek-v3.2.json", "glm-5.json"])
def test_sparse_attention_as_transformers_builds_it(name):
    """The indexer's dims, top-k and per-layer kind (GLM-5: full or shared) as transformers' config
    class derives them, and its RoPE form as its indexer module applies it."""
    cfg = MLAModelConfig.from_dict(_raw(name))
    hf = _hf_config(name)
    sp = cfg.sparse
    assert (sp.index_n_heads, sp.index_head_dim, sp.index_topk) == (hf.index_n_heads, hf.index_head_dim,
                                                                     hf.index_topk)
    assert sp.indexer_types == tuple(getattr(hf, "indexer_types", None) or ["full"] * hf.num_hidden_layers)
    modeling, prefix = _modeling(name)
    forward = inspect.getsource(getattr(modeling, f"{prefix}Indexer").forward)
    assert sp.rope_form == ("interleave" if "apply_rotary_pos_emb_interleave(q_rot" in forward else "half")


def test_a_dense_model_has_no_sparse_attention():
    assert MLAModelConfig.from_dict(_raw("deepseek-v3.json")).sparse is None


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_geometry_and_tokens_as_transformers_reads_them(name):
    raw = _raw(name)
    cfg = MLAModelConfig.from_dict(copy.deepcopy(raw))
    hf = _hf_config(name)
    assert cfg.model_type == raw["model_type"]
    for ours, theirs in [
        (cfg.num_layers, "num_hidden_layers"), (cfg.hidden_size, "hidden_size"),
        (cfg.num_heads, "num_attention_heads"), (cfg.vocab_size, "vocab_size"),
        (cfg.q_lora_rank, "q_lora_rank"), (cfg.kv_lora_rank, "kv_lora_rank"),
        (cfg.qk_nope_head_dim, "qk_nope_head_dim"), (cfg.qk_rope_head_dim, "qk_rope_head_dim"),
        (cfg.v_head_dim, "v_head_dim"), (cfg.intermediate_size, "intermediate_size"),
        (cfg.max_position_embeddings, "max_position_embeddings"), (cfg.rms_norm_eps, "rms_norm_eps"),
        (cfg.attention_bias, "attention_bias"), (cfg.tie_word_embeddings, "tie_word_embeddings"),
        (cfg.bos_token_id, "bos_token_id"),
    ]:
        assert ours == getattr(hf, theirs), theirs
    eos = hf.eos_token_id
    assert cfg.eos_token_ids == (tuple(eos) if isinstance(eos, list) else (eos,))
    assert cfg.qk_head_dim == hf.qk_nope_head_dim + hf.qk_rope_head_dim
    quant = raw.get("quantization_config")
    assert cfg.fp8_block == (tuple(quant["weight_block_size"]) if quant else None)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_rope_and_softmax_scale_as_transformers_computes_them(name):
    from transformers.modeling_rope_utils import yarn_apply_mscale

    cfg = MLAModelConfig.from_dict(_raw(name))
    hf = _hf_config(name)
    modeling, prefix = _modeling(name)
    rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(copy.deepcopy(hf))
    theirs = rotary.inv_freq.numpy()
    assert cfg.rope.dim == 2 * theirs.shape[0] == cfg.qk_rope_head_dim
    np.testing.assert_array_max_ulp(cfg.rope.inv_freq(), theirs, maxulp=1)
    assert cfg.rope.cos_sin_scaling() == pytest.approx(rotary.attention_scaling, rel=1e-12)
    # the attention module's softmax scale, as its __init__ computes it (checked in its source)
    init = inspect.getsource(getattr(modeling, f"{prefix}Attention").__init__)
    assert "self.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim" in init
    assert "self.scaling = yarn_apply_mscale(config.rope_parameters, self.qk_head_dim ** (-0.5))" in init
    expected = yarn_apply_mscale(hf.rope_parameters, (hf.qk_nope_head_dim + hf.qk_rope_head_dim) ** (-0.5))
    assert cfg.softmax_scale == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_rope_form_as_transformers_applies_it(name):
    cfg = MLAModelConfig.from_dict(_raw(name))
    hf = _hf_config(name)
    model_type = SUPPORTED[name][0]
    if model_type == "deepseek_v2":
        expected = "complex"  # apply_rotary_emb on complex pairs
    elif model_type == "minicpm3":
        expected = "half"
    elif model_type in ("deepseek_v32", "glm_moe_dsa"):
        expected = "interleave"  # their attention modules always call apply_rotary_pos_emb_interleave
    else:
        expected = "interleave" if hf.rope_interleave else "half"
    assert cfg.rope_form == expected


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_layers_and_router_as_transformers_builds_them(name):
    cfg = MLAModelConfig.from_dict(_raw(name))
    hf = _hf_config(name)
    model_type = SUPPORTED[name][0]
    n = hf.num_hidden_layers
    if model_type == "minicpm3":
        expected = ("dense",) * n
    elif getattr(hf, "mlp_layer_types", None) is not None:  # glm4_moe_lite: mlp_layer_types[i] == "sparse"
        expected = tuple("moe" if t == "sparse" else "dense" for t in hf.mlp_layer_types)
    else:  # deepseek_v2/v3: MoE from layer first_k_dense_replace on
        expected = tuple("moe" if i >= hf.first_k_dense_replace else "dense" for i in range(n))
    assert cfg.mlp_layer_types == expected
    if model_type == "minicpm3":
        assert cfg.moe is None
        return
    moe = cfg.moe
    assert moe.n_routed_experts == hf.n_routed_experts
    assert moe.n_shared_experts == hf.n_shared_experts
    assert moe.num_experts_per_tok == hf.num_experts_per_tok
    assert moe.moe_intermediate_size == hf.moe_intermediate_size
    assert moe.routed_scaling_factor == hf.routed_scaling_factor
    assert moe.norm_topk_prob == bool(hf.norm_topk_prob)
    assert (moe.n_group, moe.topk_group) == (hf.n_group, hf.topk_group)
    if model_type == "deepseek_v2":
        assert (moe.scoring, moe.topk_method) == ("softmax", hf.topk_method)
    else:
        assert (moe.scoring, moe.topk_method) == ("sigmoid", "noaux_tc")


def test_minicpm3_longrope_and_scales():
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    name = "minicpm3-4b.json"
    cfg = MLAModelConfig.from_dict(_raw(name))
    hf = _hf_config(name)
    assert cfg.rope.rope_type == "longrope"
    orig = hf.rope_parameters["original_max_position_embeddings"]
    long_inv, long_scaling = _compute_longrope_parameters(copy.deepcopy(hf), None, seq_len=orig + 1)
    np.testing.assert_array_max_ulp(cfg.rope.inv_freq(long=True), long_inv.numpy(), maxulp=1)
    assert cfg.rope.cos_sin_scaling() == pytest.approx(long_scaling, rel=1e-12)
    block = cfg.block
    assert block["embed_scale"] == hf.scale_emb
    assert block["residual_scale"] == pytest.approx(hf.scale_depth / math.sqrt(hf.num_hidden_layers), rel=1e-15)
    assert block["logits_divisor"] == pytest.approx(hf.logits_scaling, rel=1e-15)
