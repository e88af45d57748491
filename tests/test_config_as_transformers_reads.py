"""Config values that transformers 5.24 reads differently from the obvious reading: for each, our
MLAModelConfig takes from a raw config.json what transformers' own config class and rotary
embedding take from it (each changed logits by 18-115% when we disagreed)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from mla_export.checkpoint.config import MLAModelConfig
from mla_export.checkpoint.presets import tiny_config

pytest.importorskip("transformers")

YARN_A = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=1024,
              beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)
YARN_B = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=512,
              beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707)


def _raw(model_type: str, **change) -> dict:
    raw = dict(tiny_config(model_type), model_type=model_type, max_position_embeddings=4096)
    raw.update(change)
    return {k: v for k, v in raw.items() if v is not _ABSENT}


_ABSENT = object()


def _hf(raw: dict):
    from transformers import DeepseekV2Config, DeepseekV3Config

    cls = DeepseekV3Config if raw["model_type"] == "deepseek_v3" else DeepseekV2Config
    return cls.from_dict(copy.deepcopy(raw))  # what from_pretrained does (it edits nested dicts in place)


def _hf_rope(config):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = config.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        return None
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq.numpy(), scaling


def test_rope_interleave_null_is_rotate_half():
    raw = _raw("deepseek_v3", rope_interleave=None)
    assert not _hf(raw).rope_interleave  # modeling: `if config.rope_interleave:` -> rotate-half
    assert MLAModelConfig.from_dict(raw).rope_form == "half"


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_norm_topk_prob_null_is_no_normalisation(model_type):
    raw = _raw(model_type, norm_topk_prob=None)
    assert not _hf(raw).norm_topk_prob  # modeling: `if self.norm_topk_prob:`
    assert MLAModelConfig.from_dict(raw).moe.norm_topk_prob is False


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_rope_scaling_wins_over_rope_parameters(model_type):
    raw = _raw(model_type, rope_parameters=dict(YARN_A), rope_scaling=dict(YARN_B))
    hf_inv, hf_scaling = _hf_rope(_hf(raw))
    ours = MLAModelConfig.from_dict(raw).rope
    assert ours.factor == 8.0 and ours.original_max_position_embeddings == 512
    np.testing.assert_array_max_ulp(ours.inv_freq(), hf_inv, maxulp=1)
    assert ours.cos_sin_scaling() == pytest.approx(hf_scaling, rel=1e-12)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_top_level_original_max_position_embeddings_wins(model_type):
    raw = _raw(model_type, rope_parameters=dict(YARN_A), original_max_position_embeddings=2048)
    hf_inv, hf_scaling = _hf_rope(_hf(raw))
    ours = MLAModelConfig.from_dict(raw).rope
    assert ours.original_max_position_embeddings == 2048
    np.testing.assert_array_max_ulp(ours.inv_freq(), hf_inv, maxulp=1)
    assert ours.cos_sin_scaling() == pytest.approx(hf_scaling, rel=1e-12)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_absent_q_lora_rank_is_transformers_default(model_type):
    raw = _raw(model_type, q_lora_rank=_ABSENT)
    assert "q_lora_rank" not in raw
    assert MLAModelConfig.from_dict(raw).q_lora_rank == _hf(raw).q_lora_rank == 1536
    raw_null = _raw(model_type, q_lora_rank=None)  # an explicit null: no q LoRA, in both
    assert MLAModelConfig.from_dict(raw_null).q_lora_rank is None and _hf(raw_null).q_lora_rank is None
