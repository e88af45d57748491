"""`longcat_flash` (Meituan LongCat-Flash): each of `num_layers` layers holds two MLA attention
sub-layers (two latent cache layers: `num_hidden_layers` = 2 x `num_layers` is what the cache and
the graph contract count), two dense SwiGLU MLPs (`ffn_hidden_size`) and one shortcut MoE on the
first MLP's input whose output joins the layer's end. The MoE routes by softmax over
`n_routed_experts` real and `zero_expert_num` identity experts (top `moe_topk` of scores plus
`e_score_correction_bias`, times `routed_scaling_factor`; an identity expert returns its input).
MLA differs by two scales: the query times sqrt(hidden / q_lora_rank) and the normed latent times
sqrt(hidden / kv_lora_rank); RoPE pairs are always interleaved. The block: export/longcat_flash.py.
"""

from __future__ import annotations

import math

from .base import Block, Family


class LongcatFlash(Family):
    name = "longcat_flash"
    model_types = ("longcat_flash",)
    defaults = dict(
        vocab_size=131072, hidden_size=6144, num_layers=28, num_attention_heads=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, attention_bias=False,
        ffn_hidden_size=12288, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, moe_topk=12, n_routed_experts=512, zero_expert_num=256, expert_ffn_hidden_size=2048,
        routed_scaling_factor=6.0, hidden_act="silu", rope_theta=10000000.0, rope_interleave=True)
    aliases = {"num_local_experts": "n_routed_experts", "moe_topk": "num_experts_per_tok",
               "ffn_hidden_size": "intermediate_size", "expert_ffn_hidden_size": "moe_intermediate_size"}

    def prepare(self, d, error):
        for alias, key in self.aliases.items():  # transformers' attribute_map: the alias is the stored key
            if d.get(alias) is not None:
                d[key] = d[alias]
        n = d.get("num_layers")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise error(f"config.json: num_layers must be a positive integer, got {n!r}")
        d["num_hidden_layers"] = 2 * n  # latent cache layers: two attention sub-layers a layer
        if d.get("q_lora_rank") is None:
            raise error("config.json: q_lora_rank must be set for longcat_flash (its attention always has q_a_proj)")
        qk = d.get("qk_head_dim")
        if qk is not None and qk != (d.get("qk_nope_head_dim") or 0) + (d.get("qk_rope_head_dim") or 0):
            raise error(f"config.json: qk_head_dim {qk!r} must equal qk_nope_head_dim + qk_rope_head_dim")
        return d

    def rope_form(self, d):
        return "interleave"  # transformers applies the interleaved rotation unconditionally here

    def mlp_layer_types(self, d, ints, error):
        # per cache layer: the MoE counted once a layer (with its first attention sub-layer)
        return ("moe", "dense") * (ints["num_hidden_layers"] // 2)

    def router(self, d):
        return "softmax", "zero_experts"

    def block(self, d, ints, error):
        return Block(layout="longcat_flash", q_lora_scale=math.sqrt(ints["hidden_size"] / d["q_lora_rank"]),
                     kv_lora_scale=math.sqrt(ints["hidden_size"] / ints["kv_lora_rank"]))


FAMILIES = (LongcatFlash(),)
