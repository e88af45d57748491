"""LongCat-Flash's decoder layer (families/longcat_flash.py says what it is), as transformers 5.25's
`LongcatFlashDecoderLayer` computes it: layer i's attention sub-layers read and write latent cache
layers 2i and 2i + 1; the shortcut MoE runs on the first MLP's input and joins at the end."""

from __future__ import annotations

from ..checkpoint.config import MLAModelConfig
from .graph import GraphBuilder
from .layers import attention, dense_mlp, norm
from .moe import moe
from ..checkpoint.reader import CheckpointReader

__all__ = ["longcat_layer", "SUBLAYERS"]

SUBLAYERS = 2  # attention (and cache) layers per decoder layer


def longcat_layer(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, h: str, io: dict,
                  moe_forms: dict[str, str] | None) -> str:
    p = f"model.layers.{i}"
    hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
    shortcut = None
    for j in range(SUBLAYERS):
        x = norm(g, rd, f"{p}.input_layernorm.{j}.weight", h, hidden, eps)
        h = g.op("Add", h, attention(g, rd, cfg, SUBLAYERS * i + j, x, io, prefix=f"{p}.self_attn.{j}"))
        x = norm(g, rd, f"{p}.post_attention_layernorm.{j}.weight", h, hidden, eps)
        if j == 0:
            shortcut = moe(g, rd, cfg, i, x, moe_forms, prefix=f"{p}.mlp")
        h = g.op("Add", h, dense_mlp(g, rd, f"{p}.mlps.{j}", x, hidden, cfg.intermediate_size, cfg.mlp_bias))
    return g.op("Add", h, shortcut)  # (residual + mlp) + shortcut, transformers' order
