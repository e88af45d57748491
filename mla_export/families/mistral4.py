"""`mistral4` (Mistral 4): DeepSeek-V3's attention with RoPE's frequencies taken over the whole
q/k head (`partial_rotary_factor` of `qk_nope + qk_rope`, which rotates exactly the rope part),
the query multiplied by Llama 4's position-dependent factor
`1 + llama_4_scaling_beta * log(1 + floor(position / original_max_position_embeddings))`, and a
softmax router that keeps the `topk_group` groups of best top-2 sums (then top-k, optional
renormalisation, times `routed_scaling_factor`)."""

from __future__ import annotations

from .base import Block, Family, positive_number
from .deepseek import _V3


class Mistral4(Family):
    name = "mistral4"
    model_types = ("mistral4",)
    defaults = dict(_V3, vocab_size=131072, n_routed_experts=128, n_shared_experts=1, routed_scaling_factor=1.0,
                    kv_lora_rank=256, q_lora_rank=1024, qk_nope_head_dim=64, n_group=1, topk_group=1,
                    num_experts_per_tok=4, first_k_dense_replace=0, norm_topk_prob=True,
                    max_position_embeddings=1048576, bos_token_id=1, eos_token_id=2)
    aliases = {"num_local_experts": "n_routed_experts"}

    def prepare(self, d, error):
        d = super().prepare(d, error)
        nope, rope = d.get("qk_nope_head_dim"), d.get("qk_rope_head_dim")
        params = d.get("rope_scaling") or d.get("rope_parameters")
        if params is None:  # transformers' default: YaRN x128 from 8192 with Llama 4 query scaling
            params = dict(rope_type="yarn", rope_theta=10000.0, factor=128.0, original_max_position_embeddings=8192,
                          beta_fast=32.0, beta_slow=1.0, mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.1)
        if isinstance(params, dict) and isinstance(nope, int) and isinstance(rope, int) and nope + rope > 0:
            params = dict(params)
            params.setdefault("partial_rotary_factor", rope / (nope + rope))
            d["rope_parameters"], d["rope_scaling"] = params, None
        return d

    def rope_head_dim(self, d, ints):
        return ints["qk_nope_head_dim"] + ints["qk_rope_head_dim"]

    def router(self, d):
        return "softmax", "group_top2"

    def block(self, d, ints, error):
        params = d.get("rope_parameters") or {}
        if params.get("llama_4_scaling_beta") is None:
            raise error("config.json: mistral4 needs rope_parameters.llama_4_scaling_beta (its query scaling)")
        beta = params["llama_4_scaling_beta"]
        if isinstance(beta, bool) or not isinstance(beta, (int, float)):
            raise error(f"config.json: rope_parameters.llama_4_scaling_beta must be a number, got {beta!r}")
        orig = positive_number(params, "original_max_position_embeddings", error)
        return Block(q_position_scale=(float(beta), orig))


FAMILIES = (Mistral4(),)
