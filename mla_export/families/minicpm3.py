"""`minicpm3` (MiniCPM3-4B): MLA attention (DeepSeek-V2's modules) with plain rotate-half RoPE on
the rope part, a dense SwiGLU MLP in every layer, embeddings times `scale_emb`, each sub-layer's
output times `scale_depth / sqrt(num_hidden_layers)` before its residual add, and the final hidden
state divided by `hidden_size / dim_model_base` before lm_head (tied to the embedding by default)."""

from __future__ import annotations

import math

from .base import Block, Family, positive_number


class MiniCPM3(Family):
    name = "minicpm3"
    model_types = ("minicpm3",)
    defaults = dict(
        vocab_size=73448, hidden_size=2560, intermediate_size=6400, num_hidden_layers=62, num_attention_heads=40,
        max_position_embeddings=32768, rms_norm_eps=1e-5, tie_word_embeddings=True, kv_lora_rank=256,
        q_lora_rank=768, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=None, scale_emb=12, scale_depth=1.4,
        dim_model_base=256, bos_token_id=1, eos_token_id=2, hidden_act="silu", attention_bias=False, mlp_bias=False)
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "intermediate_size")
    has_moe = False

    def prepare(self, d, error):
        d = super().prepare(d, error)
        if d.get("v_head_dim") is None and isinstance(d.get("hidden_size"), int) and isinstance(
                d.get("num_attention_heads"), int) and d["num_attention_heads"] > 0:
            d["v_head_dim"] = d["hidden_size"] // d["num_attention_heads"]  # transformers' default
        return d

    def rope_form(self, d):
        return "half"

    def mlp_layer_types(self, d, ints, error):
        return ("dense",) * ints["num_hidden_layers"]

    def mlp_bias(self, d):
        return bool(d.get("mlp_bias", False))

    def block(self, d, ints, error):
        n = ints["num_hidden_layers"]
        depth = math.sqrt(n) if d.get("scale_depth") is None else positive_number(d, "scale_depth", error)
        base = ints["hidden_size"] if d.get("dim_model_base") is None else positive_number(d, "dim_model_base", error)
        return Block(embed_scale=positive_number(d, "scale_emb", error), residual_scale=depth / math.sqrt(n),
                     logits_divisor=ints["hidden_size"] / base)


FAMILIES = (MiniCPM3(),)
