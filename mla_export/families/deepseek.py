"""DeepSeek-V2 and V3 and the families that are V3's math under another name.

- `deepseek_v3`: DeepSeek-V3 / R1 / V3.1 (transformers' DeepseekV3Config defaults).
- `kimi_k2`: Kimi K2's config.json names this type and points `auto_map` at DeepSeek-V3's code;
  transformers has no class of its own for it, so V3's defaults and math apply.
- `glm4_moe_lite` (GLM-4.7-Flash): V3's attention and sigmoid router; the dense/MoE pattern is
  `mlp_layer_types` (default: layer 0 dense, the rest MoE; `first_k_dense_replace` is not read).
- `sarvam_mla` (Sarvam-105B): V3 with one expert group, a dense first layer, no q_lora by default;
  its released config spells experts `num_experts` / `num_shared_experts` and RoPE `deepseek_yarn`.
- `deepseek_v2`: V2's complex-pair RoPE, softmax greedy or group-limited routing, MLP biases.
"""

from __future__ import annotations

from .base import Family

_V3 = dict(
    first_k_dense_replace=3, n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8,
    routed_scaling_factor=2.5, norm_topk_prob=True, topk_method=None, n_group=8, topk_group=4,
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, mlp_bias=False,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, max_position_embeddings=4096,
    rope_interleave=True, q_lora_rank=1536)


class DeepseekV3(Family):
    name = "deepseek_v3"
    model_types = ("deepseek_v3", "kimi_k2")
    defaults = _V3


class Glm4MoeLite(Family):
    name = "glm4_moe_lite"
    model_types = ("glm4_moe_lite",)
    defaults = dict(_V3, n_shared_experts=1, n_routed_experts=64, num_experts_per_tok=4, routed_scaling_factor=1.8,
                    n_group=1, topk_group=1, rms_norm_eps=1e-5, max_position_embeddings=202752, q_lora_rank=768,
                    first_k_dense_replace=0)
    aliases = {"num_local_experts": "n_routed_experts"}

    def mlp_layer_types(self, d, ints, error):
        n = ints["num_hidden_layers"]
        if d.get("mlp_layer_types") is None:  # transformers' default; first_k_dense_replace is not a key here
            d = dict(d, mlp_layer_types=["dense"] + ["sparse"] * (n - 1))
        return super().mlp_layer_types(d, ints, error)


class SarvamMla(Family):
    name = "sarvam_mla"
    model_types = ("sarvam_mla",)
    defaults = dict(_V3, n_routed_experts=128, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None,
                    max_position_embeddings=4096)
    aliases = {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts",
               "num_shared_experts": "n_shared_experts", "num_mtp_layers": "num_nextn_predict_layers"}

    def prepare(self, d, error):
        d = super().prepare(d, error)
        rope = d.get("rope_scaling") or {}
        if isinstance(rope, dict) and "deepseek_yarn" in (rope.get("type"), rope.get("rope_type")):
            # the released config's name for standard YaRN (transformers converts it the same way)
            d["rope_scaling"] = {k: v for k, v in rope.items() if k != "type"} | {"rope_type": "yarn"}
        return d


class DeepseekV2(Family):
    name = "deepseek_v2"
    model_types = ("deepseek_v2",)
    defaults = dict(
        first_k_dense_replace=0, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=None,
        routed_scaling_factor=1.0, norm_topk_prob=False, topk_method="greedy", n_group=None,
        topk_group=None, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, max_position_embeddings=2048,
        rope_interleave=None, q_lora_rank=1536)

    def rope_form(self, d):
        return "complex"

    def router(self, d):
        declared = d.get("scoring_func")
        if declared not in (None, "softmax"):
            raise ValueError(f"scoring_func {declared!r} is not supported for deepseek_v2 (transformers uses softmax)")
        method = d.get("topk_method") or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"topk_method {method!r} is not supported for deepseek_v2 "
                             "(transformers knows 'greedy' and 'group_limited_greedy')")
        return "softmax", method

    def mlp_bias(self, d):
        return bool(d.get("mlp_bias", False))


FAMILIES = (DeepseekV3(), DeepseekV2(), Glm4MoeLite(), SarvamMla())
