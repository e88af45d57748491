"""`axk1` (SK Telecom A.X-K1): DeepSeek-V3 with an RMSNorm on the MoE block's output (routed plus
shared experts; the released files name it `model.layers.N.post_mlp_layernorm`, transformers'
module `mlp.post_mlp_layernorm`), a q_lora projection always, the dense/MoE pattern from
`mlp_layer_types` or the legacy `first_k_dense_replace` / `moe_layer_freq`, and a router bias that
a checkpoint may leave out (then zeros, as transformers initialises it)."""

from __future__ import annotations

from .base import Block, Family
from .deepseek import _V3


class AXK1(Family):
    name = "axk1"
    model_types = ("axk1",)
    defaults = dict(_V3, vocab_size=163840, n_routed_experts=192, max_position_embeddings=32768,
                    bos_token_id=163691, eos_token_id=163691, first_k_dense_replace=1, moe_layer_freq=1)

    def prepare(self, d, error):
        if "q_lora_rank" in d and d["q_lora_rank"] is None:
            raise error("config.json: q_lora_rank must be set for axk1 (its attention always has q_a_proj)")
        return super().prepare(d, error)

    def mlp_layer_types(self, d, ints, error):
        if d.get("mlp_layer_types") is None:
            first, freq = d.get("first_k_dense_replace"), d.get("moe_layer_freq")
            for key, v in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
                if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "moe_layer_freq" else 0):
                    raise error(f"config.json: {key} must be a non-negative integer (moe_layer_freq >= 1), got {v!r}")
            return tuple("moe" if i >= first and i % freq == 0 else "dense" for i in range(ints["num_hidden_layers"]))
        return super().mlp_layer_types(d, ints, error)

    def block(self, d, ints, error):
        return Block(post_moe_norm=True, optional_router_bias=True)


FAMILIES = (AXK1(),)
