"""Random-weight DeepSeek-V2/V3 checkpoints written with numpy alone (no torch, no transformers).

`write_random_checkpoint(out_dir, model_type, seed, **config)` writes what transformers'
`save_pretrained` writes for `DeepseekV2ForCausalLM` / `DeepseekV3ForCausalLM` with that config:
config.json (the given keys; transformers fills its defaults on load), generation_config.json,
and model.safetensors with the same tensor names and shapes (tests/test_presets.py loads it
with transformers and checks that no key is missing or unexpected, and that the export
generates what transformers generates at f32). This is what `mla-export export --preset tiny`
runs, so the README's first command needs no torch.

Weights: normal(0, initializer_range) for every matrix, as transformers initialises them;
norm weights 1 + normal(0, 0.2) and the V3 router bias normal(0, 0.1), away from their 1/0
init so that a graph that drops one of them cannot pass a test.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

__all__ = ["write_random_checkpoint", "tensor_shapes", "save_safetensors", "RANDOM_WEIGHTS_METADATA",
           "says_random_weights", "mtp_layers", "RANDOM_WEIGHTS_NOTE"]

# The safetensors metadata every random-weight checkpoint writer here puts in its files (this
# module, the tiny preset, mla_export/bench/checkpoint.py): the weights themselves say they are
# random, so an export made from them records it (contract export.random_weights) and
# `generate` can say that its text is noise, whatever directory the files were copied to.
RANDOM_WEIGHTS_KEY = "mla_export_random_weights"
RANDOM_WEIGHTS_METADATA = {"format": "pt", RANDOM_WEIGHTS_KEY: "true"}
# what the commands print when a checkpoint's metadata carries RANDOM_WEIGHTS_KEY
RANDOM_WEIGHTS_NOTE = ("this model's weights are random (the tiny preset, or a tools/make_checkpoint.py "
                       "checkpoint), so its text is noise: it shows that the pipeline runs")


def says_random_weights(metadata) -> bool:
    """Whether a safetensors `__metadata__` object carries the random-weights mark."""
    return isinstance(metadata, dict) and metadata.get(RANDOM_WEIGHTS_KEY) == "true"

_ARCH = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
_ST_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
              np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}
_NP_DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def tensor_shapes(model_type: str, c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, in transformers' naming (unfused experts)."""
    H, V = c["hidden_size"], c["vocab_size"]
    shapes = {"model.embed_tokens.weight": (V, H)}
    for i in range(c["num_hidden_layers"]):
        shapes.update(_layer_shapes(model_type, c, i))
    shapes["model.norm.weight"] = (H,)
    if not c.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    # DeepSeek-V3's multi-token-prediction layers, as its checkpoints store them: after the last
    # decoder layer, at index num_hidden_layers + j (transformers does not load them). Listed last
    # so that a checkpoint with them draws the same main-model weights as one without, seed for seed.
    for j in range(mtp_layers(c)):
        p = f"model.layers.{c['num_hidden_layers'] + j}"
        shapes.update({f"{p}.enorm.weight": (H,), f"{p}.hnorm.weight": (H,), f"{p}.eh_proj.weight": (H, 2 * H)})
        shapes.update(_layer_shapes(model_type, c, c["num_hidden_layers"] + j))
        shapes.update({f"{p}.shared_head.norm.weight": (H,), f"{p}.shared_head.head.weight": (V, H)})
    return shapes


def mtp_layers(c: dict) -> int:
    """The MTP layers a config declares (num_nextn_predict_layers, transformers' num_mtp_layers)."""
    n = c.get("num_nextn_predict_layers", c.get("num_mtp_layers")) or 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"num_nextn_predict_layers must be a non-negative integer, got {n!r}")
    return n


def _layer_shapes(model_type: str, c: dict, i: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors (dense before first_k_dense_replace, MoE from there)."""
    H, nh = c["hidden_size"], c["num_attention_heads"]
    nope, rope, vd, kvr = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    qr = c.get("q_lora_rank")
    shapes = {}
    p = f"model.layers.{i}"
    shapes[f"{p}.input_layernorm.weight"] = (H,)
    shapes[f"{p}.post_attention_layernorm.weight"] = (H,)
    a = f"{p}.self_attn"
    if qr:
        shapes[f"{a}.q_a_proj.weight"] = (qr, H)
        shapes[f"{a}.q_a_layernorm.weight"] = (qr,)
        shapes[f"{a}.q_b_proj.weight"] = (nh * (nope + rope), qr)
    else:
        shapes[f"{a}.q_proj.weight"] = (nh * (nope + rope), H)
    shapes[f"{a}.kv_a_proj_with_mqa.weight"] = (kvr + rope, H)
    shapes[f"{a}.kv_a_layernorm.weight"] = (kvr,)
    shapes[f"{a}.kv_b_proj.weight"] = (nh * (nope + vd), kvr)
    shapes[f"{a}.o_proj.weight"] = (H, nh * vd)
    m = f"{p}.mlp"
    if i < c.get("first_k_dense_replace", 0) or not c.get("n_routed_experts"):
        inter = c["intermediate_size"]
        shapes.update({f"{m}.gate_proj.weight": (inter, H), f"{m}.up_proj.weight": (inter, H),
                       f"{m}.down_proj.weight": (H, inter)})
        return shapes
    inter, E = c["moe_intermediate_size"], c["n_routed_experts"]
    shapes[f"{m}.gate.weight"] = (E, H)
    if model_type == "deepseek_v3":
        shapes[f"{m}.gate.e_score_correction_bias"] = (E,)
    for e in range(E):
        x = f"{m}.experts.{e}"
        shapes.update({f"{x}.gate_proj.weight": (inter, H), f"{x}.up_proj.weight": (inter, H),
                       f"{x}.down_proj.weight": (H, inter)})
    if c.get("n_shared_experts"):
        s_inter = inter * c["n_shared_experts"]
        x = f"{m}.shared_experts"
        shapes.update({f"{x}.gate_proj.weight": (s_inter, H), f"{x}.up_proj.weight": (s_inter, H),
                       f"{x}.down_proj.weight": (H, s_inter)})
    return shapes


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """The safetensors layout: 8-byte little-endian header length, the JSON header (padded with
    spaces to a multiple of 8), then each tensor's little-endian bytes in header order."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} is not written here (f32/f16/bf16/f8_e4m3 only)")
        header[name] = {"dtype": _ST_DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in arrays:
            f.write(arr.tobytes())


def write_random_checkpoint(out_dir, model_type: str, seed: int, config: dict, dtype: str = "float32") -> Path:
    """Write config.json, generation_config.json and model.safetensors for `config` (the
    transformers constructor arguments); returns the directory."""
    if model_type not in _ARCH:
        raise ValueError(f"model_type must be one of {', '.join(_ARCH)}, got {model_type!r}")
    np_dtype = _NP_DTYPES.get(dtype)
    if np_dtype is None:
        raise ValueError(f"dtype must be one of {', '.join(_NP_DTYPES)}, got {dtype!r}")
    rng = np.random.default_rng(seed)
    std = float(config.get("initializer_range", 0.02))
    tensors = {}
    for name, shape in tensor_shapes(model_type, config).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith("e_score_correction_bias"):
            w = 0.1 * rng.standard_normal(shape)
        else:
            w = std * rng.standard_normal(shape)
        tensors[name] = w.astype(np_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(config, model_type=model_type, architectures=[_ARCH[model_type]], dtype=dtype)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": cfg.get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_safetensors(out / "model.safetensors", tensors, metadata=RANDOM_WEIGHTS_METADATA)
    return out
