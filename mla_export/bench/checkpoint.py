"""Random-weight checkpoints at DeepSeek's real sizes, written tensor by tensor (no torch).

`write_checkpoint(out_dir, shape="v2lite", layers=3)` writes what a Hugging Face checkpoint of
that model holds: config.json (the hub model's own config, only num_hidden_layers changed),
generation_config.json, sharded safetensors with model.safetensors.index.json, and a byte-level
BPE tokenizer of the full vocabulary (tokenizer.py). Tensor names, shapes and dtypes are those
transformers 5.24's DeepseekV2/V3ForCausalLM.save_pretrained writes (per-expert tensors, no
fused expert blocks; tests/test_make_checkpoint.py checks this against transformers).

Memory stays bounded by one chunk of one tensor: every shard's header is written first (every
tensor's shape and dtype are known from the config), then each tensor is generated in row chunks
and appended. The values only depend on (seed, tensor name), not on the sharding.

Random values follow mla_export/checkpoint/presets.py: linear and embedding weights N(0, std) with a larger
spread than transformers' init so that greedy tokens and expert choices are not near-ties, norm
weights 1 + 0.2 N(0, 1) and the router's correction bias 0.1 N(0, 1), so that a graph which drops
one of them cannot pass a test.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint.writer import RANDOM_WEIGHTS_METADATA

__all__ = ["SHAPES", "TensorSpec", "checkpoint_config", "tensor_specs", "write_checkpoint", "size_bytes",
           "CheckpointWriteError"]


class CheckpointWriteError(ValueError):
    """An invalid request to write a checkpoint (shape, layer count, target directory)."""


# DeepSeek-V2-Lite's config.json as published (auto_map dropped: transformers has the classes).
V2LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}

# DeepSeek-V3's config.json as published, except: bf16 weights (no fp8 quantization_config) and
# num_nextn_predict_layers 0 (the multi-token-prediction layer's weights are not written).
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280,
}

# V3's structure (model type deepseek_v3: sigmoid router scores with a correction bias) at
# V2-Lite's dimensions, V2-Lite's values where both configs have a field (no q-LoRA, 64 experts
# top-6 in one group, 2 shared, routed scale 1.0, its YaRN): the same weight bytes and decode work
# as v2lite, for peers whose transformers has deepseek_v3 but not deepseek_v2 (optimum-intel 2.2
# pins transformers 4.53, which has no deepseek_v2).
V3_AT_V2LITE = {**V3, **{k: V2LITE[k] for k in (
    "bos_token_id", "eos_token_id", "first_k_dense_replace", "hidden_size", "intermediate_size",
    "moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts", "norm_topk_prob",
    "num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "q_lora_rank",
    "rope_scaling", "routed_scaling_factor", "topk_group", "vocab_size")}}

# The same structures at tiny dimensions (tests and the smoke benchmark).
_TINY_DIMS = {
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 4,
    "num_key_value_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 24, "max_position_embeddings": 4096,
}
TINY_V2 = {**V2LITE, **_TINY_DIMS, "n_routed_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024,
           "bos_token_id": 1000, "eos_token_id": 1001, "num_hidden_layers": 3,
           "rope_scaling": {**V2LITE["rope_scaling"], "factor": 4, "original_max_position_embeddings": 1024}}
TINY_V3 = {**V3, **_TINY_DIMS, "q_lora_rank": 48, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4,
           "topk_group": 2, "vocab_size": 1024, "num_hidden_layers": 3, "first_k_dense_replace": 1,
           "rope_scaling": {**V3["rope_scaling"], "factor": 4, "original_max_position_embeddings": 1024}}


@dataclass(frozen=True)
class Shape:
    config: dict
    weight_std: float  # N(0, std) for linear and embedding weights
    reserved_from: int  # tokenizer: ids >= this (and the BOS/EOS ids) are special tokens
    about: str


SHAPES = {
    # std 0.03 at hidden 2048 (the earlier benchmark's choice): logits and router scores spread ~1.4
    "v2lite": Shape(V2LITE, 0.03, 100000, "DeepSeek-V2-Lite (15.7B parameters at 27 layers)"),
    "v3": Shape(V3, 0.015, 128000, "DeepSeek-V3 dimensions (hidden 7168, 128 heads, 256 experts top-8, sigmoid)"),
    "v3-at-v2lite": Shape(V3_AT_V2LITE, 0.03, 100000,
                          "V3's structure (deepseek_v3, sigmoid routing) at V2-Lite's dimensions"),
    # tiny dims: presets.py's spread (std 0.08 at hidden 64)
    "tiny-v2": Shape(TINY_V2, 0.08, 1000, "V2-Lite's structure at tiny dimensions"),
    "tiny-v3": Shape(TINY_V3, 0.08, 1000, "V3's structure at tiny dimensions"),
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # "linear" (N(0, std)), "norm" (1 + 0.2 N), "bias" (0.1 N)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def checkpoint_config(shape: str, layers: int | None = None, dense_layers: int | None = None,
                      mtp: bool = False) -> dict:
    """The config.json of `shape` with `layers` decoder layers (default: the real model's count).
    The first min(real first_k_dense_replace, layers - 1) layers are dense unless `dense_layers`
    says otherwise, so that any layer count >= 2 keeps at least one MoE layer. mtp: with V3's
    multi-token-prediction layer (num_nextn_predict_layers 1, as the released config)."""
    if shape not in SHAPES:
        raise CheckpointWriteError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    cfg = json.loads(json.dumps(SHAPES[shape].config))
    n = cfg["num_hidden_layers"] if layers is None else layers
    if not isinstance(n, int) or n < 1:
        raise CheckpointWriteError(f"--layers must be a positive integer, got {layers!r}")
    dense = min(cfg["first_k_dense_replace"], max(n - 1, 0)) if dense_layers is None else dense_layers
    if not isinstance(dense, int) or not 0 <= dense <= n:
        raise CheckpointWriteError(f"--dense-layers must be between 0 and --layers ({n}), got {dense_layers!r}")
    cfg["num_hidden_layers"], cfg["first_k_dense_replace"] = n, dense
    if mtp:
        if cfg["model_type"] != "deepseek_v3":
            raise CheckpointWriteError(f"--mtp: {shape} ({cfg['model_type']}) has no multi-token-prediction layer; "
                                       "use --shape v3")
        cfg["num_nextn_predict_layers"] = 1
    return cfg


def tensor_specs(cfg: dict) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in file order (embedding, layer by layer, norm, lm_head)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise CheckpointWriteError("attention_bias / mlp_bias checkpoints are not generated (DeepSeek has none)")
    out = [TensorSpec("model.embed_tokens.weight", (V, H), "linear")]
    for i in range(cfg["num_hidden_layers"]):
        out += _layer_specs(cfg, i)
    out += [TensorSpec("model.norm.weight", (H,), "norm"), TensorSpec("lm_head.weight", (V, H), "linear")]
    # The multi-token-prediction layer, as DeepSeek-V3's checkpoint stores it (index
    # num_hidden_layers: enorm, hnorm, eh_proj [H, 2H], a decoder layer, shared_head.norm/.head;
    # the embedding is the model's). Last, so the main model's values do not move.
    for j in range(cfg.get("num_nextn_predict_layers") or 0):
        p = f"model.layers.{cfg['num_hidden_layers'] + j}."
        layer = _layer_specs(cfg, cfg["num_hidden_layers"] + j) + [
            TensorSpec(p + "enorm.weight", (H,), "norm"), TensorSpec(p + "hnorm.weight", (H,), "norm"),
            TensorSpec(p + "eh_proj.weight", (H, 2 * H), "linear"),
            TensorSpec(p + "shared_head.norm.weight", (H,), "norm"),
            TensorSpec(p + "shared_head.head.weight", (V, H), "linear")]
        out += sorted(layer, key=lambda t: t.name)
    return out


def _layer_specs(cfg: dict, i: int) -> list[TensorSpec]:
    """Decoder layer i's tensors, in name order (dense before first_k_dense_replace, else MoE)."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vd, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    ql = cfg.get("q_lora_rank")
    v3 = cfg["model_type"] == "deepseek_v3"
    p = f"model.layers.{i}."
    layer = [TensorSpec(p + "input_layernorm.weight", (H,), "norm"),
             TensorSpec(p + "post_attention_layernorm.weight", (H,), "norm")]
    a = p + "self_attn."
    if ql:
        layer += [TensorSpec(a + "q_a_proj.weight", (ql, H), "linear"),
                  TensorSpec(a + "q_a_layernorm.weight", (ql,), "norm"),
                  TensorSpec(a + "q_b_proj.weight", (nh * (nope + rope), ql), "linear")]
    else:
        layer.append(TensorSpec(a + "q_proj.weight", (nh * (nope + rope), H), "linear"))
    layer += [TensorSpec(a + "kv_a_proj_with_mqa.weight", (r + rope, H), "linear"),
              TensorSpec(a + "kv_a_layernorm.weight", (r,), "norm"),
              TensorSpec(a + "kv_b_proj.weight", (nh * (nope + vd), r), "linear"),
              TensorSpec(a + "o_proj.weight", (H, nh * vd), "linear")]
    m = p + "mlp."
    if i < cfg["first_k_dense_replace"]:
        inter = cfg["intermediate_size"]
        layer += [TensorSpec(m + "gate_proj.weight", (inter, H), "linear"),
                  TensorSpec(m + "up_proj.weight", (inter, H), "linear"),
                  TensorSpec(m + "down_proj.weight", (H, inter), "linear")]
    else:
        E, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        layer.append(TensorSpec(m + "gate.weight", (E, H), "linear"))
        if v3:
            layer.append(TensorSpec(m + "gate.e_score_correction_bias", (E,), "bias"))
        for e in range(E):
            x = f"{m}experts.{e}."
            layer += [TensorSpec(x + "gate_proj.weight", (inter, H), "linear"),
                      TensorSpec(x + "up_proj.weight", (inter, H), "linear"),
                      TensorSpec(x + "down_proj.weight", (H, inter), "linear")]
        if cfg.get("n_shared_experts"):
            s, si = m + "shared_experts.", inter * cfg["n_shared_experts"]
            layer += [TensorSpec(s + "gate_proj.weight", (si, H), "linear"),
                      TensorSpec(s + "up_proj.weight", (si, H), "linear"),
                      TensorSpec(s + "down_proj.weight", (H, si), "linear")]
    return sorted(layer, key=lambda t: t.name)


DTYPES = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}


def size_bytes(cfg: dict, dtype: str = "bf16") -> int:
    return sum(t.numel for t in tensor_specs(cfg)) * DTYPES[dtype][1]


def _np_dtype(dtype: str):
    if dtype == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"f16": np.float16, "f32": np.float32}[dtype]


def _chunks(spec: TensorSpec, seed: int, std: float, np_dtype, max_elems: int):
    """The tensor's values in row chunks; the stream depends on (seed, name) only."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    rows = spec.shape[0]
    row = spec.numel // rows
    step = max(1, max_elems // max(row, 1))
    for r0 in range(0, rows, step):
        n = min(step, rows - r0) * row
        x = rng.standard_normal(n, dtype=np.float32)
        if spec.kind == "linear":
            x *= np.float32(std)
        elif spec.kind == "norm":
            x = np.float32(1.0) + np.float32(0.2) * x
        else:
            x *= np.float32(0.1)
        yield x.astype(np_dtype)


def _plan_shards(specs: list[TensorSpec], elem: int, max_shard_bytes: int) -> list[list[TensorSpec]]:
    shards, cur, size = [], [], 0
    for t in specs:
        b = t.numel * elem
        if cur and size + b > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += b
    if cur:
        shards.append(cur)
    return shards


def _header(tensors: list[TensorSpec], st_dtype: str, elem: int) -> bytes:
    h, off = {"__metadata__": dict(RANDOM_WEIGHTS_METADATA)}, 0  # exports of it say their weights are random
    for t in tensors:
        n = t.numel * elem
        h[t.name] = {"dtype": st_dtype, "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(h, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_checkpoint(out_dir, shape: str = "v2lite", layers: int | None = None, *, seed: int = 0,
                     dtype: str = "bf16", max_shard_bytes: int = 4 * 2**30, dense_layers: int | None = None,
                     tokenizer: bool = True, overwrite: bool = False, chunk_elems: int = 1 << 24,
                     progress=None, mtp: bool = False) -> Path:
    """Write the checkpoint into `out_dir` (through `out_dir`.partial, renamed when complete)."""
    out = Path(out_dir)
    if dtype not in DTYPES:
        raise CheckpointWriteError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise CheckpointWriteError(f"--shard-size must be positive, got {max_shard_bytes!r}")
    if out.exists() and not overwrite:
        raise CheckpointWriteError(f"{out} exists (pass --overwrite to replace it)")
    cfg = checkpoint_config(shape, layers, dense_layers, mtp)
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    specs = tensor_specs(cfg)
    st_dtype, elem = DTYPES[dtype]
    need = sum(t.numel for t in specs) * elem
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if need > free:
        raise CheckpointWriteError(f"{out}: needs {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    np_dtype = _np_dtype(dtype)
    std = SHAPES[shape].weight_std
    shards = _plan_shards(specs, elem, max_shard_bytes)
    weight_map, done = {}, 0
    for k, tensors in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        with open(tmp / fname, "wb") as f:
            f.write(_header(tensors, st_dtype, elem))
            for t in tensors:
                for chunk in _chunks(t, seed, std, np_dtype, chunk_elems):
                    f.write(chunk.tobytes())
                weight_map[t.name] = fname
                done += t.numel * elem
                if progress:
                    progress(done, need)
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": need}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer:
        from .tokenizer import write_tokenizer

        write_tokenizer(tmp, cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"], SHAPES[shape].reserved_from)
    (tmp / "mla_checkpoint.json").write_text(json.dumps(
        {"made_by": "mla_export.bench.checkpoint", "shape": shape, "seed": seed, "dtype": dtype,
         "weight_std": std, "layers": cfg["num_hidden_layers"]}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
