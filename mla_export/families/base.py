"""`Family`: what one MLA model family changes relative to DeepSeek-V3, as data the exporter reads.

A family is one small file under `mla_export/families/`: its `model_type`s, the defaults of its
transformers config class for keys a config.json may leave out, and the few methods below that it
overrides. Everything a family returns lands in `MLAModelConfig` as plain fields (RoPE form, MLP
kind of each layer, router, embedding / residual / logits scales, an extra norm), which the one
graph builder (`export/model.py`, `export/layers.py`, `export/moe.py`) reads; no family name is
tested outside this package. Errors are `ConfigError` naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Family", "Block", "SparseAttention"]


@dataclass(frozen=True)
class SparseAttention:
    """DeepSeek Sparse Attention's indexer (families/dsa.py); `MLAModelConfig.sparse`."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    rope_form: str  # the indexer's own RoPE: "half" (V3.2) or "interleave" (GLM-5)
    indexer_types: tuple[str, ...]  # per layer: "full" (its own indexer and key cache) or "shared"

    def index_layer(self, layer: int) -> int:
        """The indexer-cache number of a full layer (index_cache.<j>), or of the full layer a shared one follows."""
        return sum(t == "full" for t in self.indexer_types[:layer + 1]) - 1

    def facts(self) -> dict:
        return dict(index_n_heads=self.index_n_heads, index_head_dim=self.index_head_dim,
                    index_topk=self.index_topk, indexer_types=list(self.indexer_types), rope_form=self.rope_form)


class Block(dict):
    """The per-family block facts (`MLAModelConfig.block`): keys and their DeepSeek values."""

    DEFAULTS = dict(
        embed_scale=1.0,        # embedding rows multiplied by this (MiniCPM3's scale_emb)
        residual_scale=1.0,     # each sub-layer's output multiplied by this before the residual add
        logits_divisor=1.0,     # final hidden divided by this before lm_head (MiniCPM3)
        post_moe_norm=False,    # an RMSNorm on the MoE block's output (A.X-K1)
        q_position_scale=None,  # (beta, original_max): q *= 1 + beta * log(1 + floor(pos / original_max))
        q_lora_scale=1.0,       # the query times this after q_b_proj (LongCat-Flash)
        kv_lora_scale=1.0,      # the normed latent (what the cache holds) times this (LongCat-Flash)
        layout="standard",      # the decoder layer's builder (export/model.py LAYOUTS): "standard" or "longcat_flash"
        optional_router_bias=False,  # a missing e_score_correction_bias means zeros (A.X-K1), not a broken file
    )

    def __init__(self, **kw):
        unknown = set(kw) - set(self.DEFAULTS)
        if unknown:
            raise KeyError(f"unknown block fact(s): {sorted(unknown)}")
        super().__init__({**self.DEFAULTS, **kw})


class Family:
    """DeepSeek-V3's reading of a config; a family overrides what its transformers class does differently."""

    name = "deepseek_v3"
    model_types: tuple[str, ...] = ()
    defaults: dict = {}
    # transformers' `attribute_map` aliases a released config.json may use (alias -> our key)
    aliases: dict = {}
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size")
    has_moe = True

    def prepare(self, d: dict, error) -> dict:
        """Legacy keys and derived defaults, before any check (d is a copy the family may edit)."""
        for alias, key in self.aliases.items():
            if alias in d and d.get(key) is None:
                d[key] = d.pop(alias)
        return d

    def rope_form(self, d: dict) -> str:
        """"interleave" (pairs), "half" (rotate-half) or "complex" (V2's complex pairs)."""
        return "interleave" if d["rope_interleave"] else "half"

    def rope_head_dim(self, d: dict, ints: dict) -> int:
        """The dimension `partial_rotary_factor` multiplies (transformers' `config.head_dim`)."""
        return ints["qk_rope_head_dim"]

    def mlp_layer_types(self, d: dict, ints: dict, error) -> tuple[str, ...]:
        """"dense" or "moe" for each layer: first_k_dense_replace dense layers, then MoE."""
        first = d.get("first_k_dense_replace")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise error(f"config.json: first_k_dense_replace must be an integer >= 0, got {first!r}")
        types = d.get("mlp_layer_types")
        if types is not None:
            return _layer_types(types, ints["num_hidden_layers"], error)
        return tuple("dense" if i < first else "moe" for i in range(ints["num_hidden_layers"]))

    def router(self, d: dict) -> tuple[str, str]:
        """(scoring, topk_method): V3's sigmoid with e_score_correction_bias and top-2-sum groups."""
        declared = d.get("scoring_func")
        if declared not in (None, "sigmoid"):
            raise ValueError(f"scoring_func {declared!r} is not supported for {self.name} (transformers uses sigmoid)")
        return "sigmoid", "noaux_tc"

    def block(self, d: dict, ints: dict, error) -> Block:
        return Block()

    def mlp_bias(self, d: dict) -> bool:
        return False

    def sparse_attention(self, d: dict, ints: dict, error) -> SparseAttention | None:
        """DeepSeek Sparse Attention's indexer, or None for dense causal attention."""
        return None


def _layer_types(types, n: int, error) -> tuple[str, ...]:
    if not isinstance(types, list) or len(types) != n:
        raise error(f"config.json: mlp_layer_types must be a list of {n} entries (one per layer), got {types!r}")
    out = []
    for t in types:
        if t not in ("dense", "sparse", "moe"):
            raise error(f"config.json: mlp_layer_types entries must be 'dense' or 'sparse', got {t!r}")
        out.append("dense" if t == "dense" else "moe")
    return tuple(out)


def positive_number(d: dict, key: str, error) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise error(f"config.json: {key} must be a positive number, got {v!r}")
    return float(v)
