"""config.json's dimensions against what the checkpoint's weights hold, before the exporter
allocates or loops over anything sized by them.

The safetensors headers (read when the `CheckpointReader` opens the checkpoint) say which decoder
layers exist and each tensor's shape. A config that claims more layers than the weights hold, a
dimension the tensors do not have, or a dense/MoE pattern the layers do not follow is refused
here with one `ConfigError` naming the config keys, instead of after a per-layer loop over the
claimed count or as a tensor-shape error that does not say which key is wrong. Only tensors the
checkpoint holds under DeepSeek's names are compared (a family with other names, LongCat-Flash's
sub-layers, is still checked tensor by tensor where the graph reads it). Layers past the config's
count (DeepSeek-V3's multi-token-prediction layer 61) are left alone.
"""

from __future__ import annotations

import re

from ..checkpoint.config import ConfigError, MLAModelConfig
from ..checkpoint.reader import CheckpointReader

__all__ = ["check_weights_hold"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_DENSE_MOE_KEYS = "first_k_dense_replace / mlp_layer_types / moe_layer_freq"


def _expected(cfg: MLAModelConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(tensor name, shape config.json implies, the keys that imply it) for the embedding and the
    first layer's attention, the first dense MLP and the first MoE block (one of each suffices:
    every layer is built from the same keys)."""
    h, dn, dr, dv, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    hidden, q = cfg.hidden_size, cfg.q_lora_rank
    a = "model.layers.0.self_attn"
    heads = "num_attention_heads, qk_nope_head_dim, qk_rope_head_dim"
    out = [("model.embed_tokens.weight", (cfg.vocab_size, hidden), "vocab_size, hidden_size"),
           (f"{a}.kv_a_proj_with_mqa.weight", (r + dr, hidden), "kv_lora_rank, qk_rope_head_dim, hidden_size"),
           (f"{a}.kv_b_proj.weight", (h * (dn + dv), r),
            "num_attention_heads, qk_nope_head_dim, v_head_dim, kv_lora_rank"),
           (f"{a}.o_proj.weight", (hidden, h * dv), "hidden_size, num_attention_heads, v_head_dim")]
    if q is None:
        out.append((f"{a}.q_proj.weight", (h * (dn + dr), hidden), f"{heads}, hidden_size, q_lora_rank (null)"))
    else:
        out += [(f"{a}.q_a_proj.weight", (q, hidden), "q_lora_rank, hidden_size"),
                (f"{a}.q_b_proj.weight", (h * (dn + dr), q), f"{heads}, q_lora_rank")]
    kinds = cfg.mlp_layer_types
    dense = next((i for i, t in enumerate(kinds) if t == "dense"), None)
    if dense is not None:
        out.append((f"model.layers.{dense}.mlp.gate_proj.weight", (cfg.intermediate_size, hidden),
                    "intermediate_size, hidden_size"))
    moe = next((i for i, t in enumerate(kinds) if t == "moe"), None)
    if moe is not None and cfg.moe is not None:
        m = f"model.layers.{moe}.mlp"
        out += [(f"{m}.gate.weight", (cfg.moe.n_routed_experts, hidden), "n_routed_experts, hidden_size"),
                (f"{m}.experts.0.gate_proj.weight", (cfg.moe.moe_intermediate_size, hidden),
                 "moe_intermediate_size, hidden_size"),
                (f"{m}.shared_experts.gate_proj.weight",
                 (cfg.moe.moe_intermediate_size * cfg.moe.n_shared_experts, hidden),
                 "n_shared_experts, moe_intermediate_size, hidden_size")]
    return out


def check_weights_hold(cfg: MLAModelConfig, reader: CheckpointReader, sublayers: int) -> None:
    """ConfigError unless the weights hold decoder layers 0 .. num_layers / sublayers - 1, every
    compared tensor has the shape config.json implies, and (DeepSeek's layer layout) each layer's
    MLP is the kind the config says. sublayers: cache layers per decoder layer."""
    held = {int(m.group(1)) for m in map(_LAYER.match, reader.names()) if m}
    layers = cfg.num_layers // sublayers
    key = "num_layers" if sublayers > 1 else "num_hidden_layers"
    missing = next((i for i in range(layers) if i not in held), None)  # layers <= MAX_LAYERS (config_values)
    if missing is not None:
        raise ConfigError(f"config.json: {key} {cfg.raw.get(key, layers)} means {layers} decoder layers, but the "
                          f"weights hold {len(held)} (no tensor under model.layers.{missing}.)")
    a = "model.layers.0.self_attn"
    if cfg.q_lora_rank is None and reader.has(f"{a}.q_a_proj.weight") and not reader.has(f"{a}.q_proj.weight"):
        raise ConfigError("config.json: q_lora_rank is null (a full-rank q_proj), but the weights hold the low-rank "
                          f"{a}.q_a_proj / q_b_proj")
    if cfg.q_lora_rank is not None and reader.has(f"{a}.q_proj.weight") and not reader.has(f"{a}.q_a_proj.weight"):
        raise ConfigError(f"config.json: q_lora_rank is {cfg.q_lora_rank} (a low-rank q_a_proj / q_b_proj), but the "
                          f"weights hold a full-rank {a}.q_proj (q_lora_rank: null)")
    if cfg.block["layout"] == "standard":
        _check_mlp_kinds(cfg, reader, layers)
    moe = next((i for i, t in enumerate(cfg.mlp_layer_types) if t == "moe"), None)
    if (cfg.moe is not None and moe is not None and cfg.block["layout"] == "standard"
            and reader.has(f"model.layers.{moe}.mlp.gate.weight")):  # a MoE block under DeepSeek's names
        shared = reader.has(f"model.layers.{moe}.mlp.shared_experts.gate_proj.weight")
        if shared != bool(cfg.moe.n_shared_experts):
            raise ConfigError(f"config.json: n_shared_experts is {cfg.moe.n_shared_experts}, but the weights hold "
                              f"{'shared experts' if shared else 'none'} in layer {moe}'s MoE block")
    for name, want, keys in _expected(cfg):
        if reader.has(name) and reader.shape(name) != want:
            raise ConfigError(f"config.json: {keys} disagree with the weights: {name} is {list(reader.shape(name))}, "
                              f"the config implies {list(want)}")


def _check_mlp_kinds(cfg: MLAModelConfig, reader: CheckpointReader, layers: int) -> None:
    for i, kind in enumerate(cfg.mlp_layer_types[:layers]):
        p = f"model.layers.{i}.mlp"
        dense, moe = reader.has(f"{p}.gate_proj.weight"), reader.has(f"{p}.gate.weight")
        if (kind == "moe" and dense and not moe) or (kind == "dense" and moe and not dense):
            said = "a MoE" if kind == "moe" else "a dense"
            raise ConfigError(f"config.json: {_DENSE_MOE_KEYS} make layer {i} {said} layer, but the weights hold "
                              f"{'a dense MLP' if dense else 'a MoE block'} there")
