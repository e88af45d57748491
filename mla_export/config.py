"""`MLAModelConfig`: the facts of a DeepSeek-V2/V3-style checkpoint, read from its `config.json`.

The pinned transformers version (5.24) is the oracle for every formula here: a key missing from
`config.json` takes the default of transformers' own `DeepseekV2Config` / `DeepseekV3Config`,
and the derived values (RoPE frequencies, YaRN attention factor, softmax scale) are computed the
way `modeling_deepseek_v2/v3.py` and `modeling_rope_utils.py` compute them. Only the geometry
keys (layers, sizes, heads, MLA dims, vocab) are required: a checkpoint without them is broken.

This module needs only the standard library and numpy, so the runtime may import it too.
Errors are `ConfigError` (a ValueError) with the offending key in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .json_file import read_json

__all__ = ["ConfigError", "MLAModelConfig", "MoEConfig", "RopeConfig", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")

# transformers 5.24 class defaults for the keys a config.json may leave out.
_DEFAULTS = {
    "deepseek_v2": dict(
        first_k_dense_replace=0, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=None,
        routed_scaling_factor=1.0, norm_topk_prob=False, topk_method="greedy", n_group=None,
        topk_group=None, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, max_position_embeddings=2048,
        rope_interleave=None, q_lora_rank=1536),
    "deepseek_v3": dict(
        first_k_dense_replace=3, n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8,
        routed_scaling_factor=2.5, norm_topk_prob=True, topk_method=None, n_group=8, topk_group=4,
        rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, max_position_embeddings=4096,
        rope_interleave=True, q_lora_rank=1536),
}
_REQUIRED_INTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size",
                  "moe_intermediate_size")


class ConfigError(ValueError):
    """config.json describes a model this exporter cannot (or must not) convert."""


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str  # "default" or "yarn"
    theta: float
    dim: int  # rotated dims (= qk_rope_head_dim * partial_rotary_factor)
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def inv_freq(self) -> np.ndarray:
        """[dim // 2] float32 inverse frequencies, computed in float32 as transformers does."""
        f32 = np.float32
        exponents = np.arange(0, self.dim, 2, dtype=np.int64).astype(f32) / f32(self.dim)
        pos_freqs = np.power(f32(self.theta), exponents, dtype=f32)
        if self.rope_type == "default":
            return (f32(1.0) / pos_freqs).astype(f32)
        extrapolation = f32(1.0) / pos_freqs
        interpolation = f32(1.0) / (f32(self.factor) * pos_freqs)
        low, high = self._correction_range()
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(self.dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
        extra_factor = f32(1.0) - ramp
        return (interpolation * (f32(1.0) - extra_factor) + extrapolation * extra_factor).astype(f32)

    def _correction_range(self) -> tuple[float, float]:
        def correction_dim(num_rotations: float) -> float:
            return (self.dim * math.log(self.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
                2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, self.dim - 1)

    def cos_sin_scaling(self) -> float:
        """The factor transformers multiplies cos and sin by (`attention_scaling`)."""
        if self.rope_type == "default":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return float(_yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim))
        return _yarn_mscale(self.factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MoEConfig:
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    scoring: str  # "sigmoid" (V3, with e_score_correction_bias) or "softmax" (V2)
    topk_method: str  # V3: "noaux_tc"; V2: "greedy" or "group_limited_greedy"
    n_group: int
    topk_group: int


@dataclass(frozen=True)
class MLAModelConfig:
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    rope: RopeConfig
    rope_form: str  # "interleave" (V3 default), "half" (V3 rope_interleave=False), "complex" (V2)
    moe: MoEConfig
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def row_width(self) -> int:
        """Width of one latent cache row: [kv_c (r) | k_pe (dr)]."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """`qk_head_dim ** -0.5`, times mscale(factor, mscale_all_dim)**2 for YaRN with
        mscale_all_dim, exactly as transformers' `yarn_apply_mscale` (same float operations)."""
        scaling = self.qk_head_dim ** (-0.5)
        if self.rope.rope_type != "default" and self.rope.mscale_all_dim:
            m = _yarn_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scaling = scaling * m * m
        return scaling

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.moe.first_k_dense_replace

    def expanded_kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """What a per-head expanded K/V cache (K = dn + dr, V = dv per head) would need."""
        return self.num_layers * self.num_heads * (self.qk_head_dim + self.v_head_dim) * dtype_bytes

    def facts(self) -> dict:
        """The model facts the graph contract records."""
        return dict(model_type=self.model_type, num_layers=self.num_layers, num_heads=self.num_heads,
                    hidden_size=self.hidden_size, kv_lora_rank=self.kv_lora_rank,
                    qk_rope_head_dim=self.qk_rope_head_dim, qk_nope_head_dim=self.qk_nope_head_dim,
                    v_head_dim=self.v_head_dim, q_lora_rank=self.q_lora_rank, vocab_size=self.vocab_size,
                    max_position_embeddings=self.max_position_embeddings, bos_token_id=self.bos_token_id,
                    eos_token_ids=list(self.eos_token_ids), softmax_scale=self.softmax_scale,
                    rope_type=self.rope.rope_type, rope_form=self.rope_form,
                    num_moe_layers=sum(self.is_moe_layer(i) for i in range(self.num_layers)),
                    n_routed_experts=self.moe.n_routed_experts,
                    num_experts_per_tok=self.moe.num_experts_per_tok)

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "MLAModelConfig":
        path = Path(model_dir) / "config.json"
        raw = read_json(path, ConfigError, " (a Hugging Face checkpoint directory has a config.json)")
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "MLAModelConfig":
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"unsupported model_type {model_type!r}: this exporter converts "
                              f"{' and '.join(SUPPORTED_MODEL_TYPES)} (DeepSeek-V2/V3-style MLA) models")
        if raw.get("quantization_config"):
            qm = raw["quantization_config"].get("quant_method", "?")
            raise ConfigError(f"quantized checkpoints are not supported (quantization_config.quant_method="
                              f"{qm!r}); convert the weights to bf16/f16/f32 first")
        d = {**_DEFAULTS[model_type], **{k: v for k, v in raw.items() if v is not None or k == "q_lora_rank"}}
        # transformers 5.24 keeps an explicit null (its configs are dataclasses) and tests these two
        # for truth: null means rotate-half RoPE and no top-k renormalisation, not the default.
        for key in ("rope_interleave", "norm_topk_prob"):
            if key in raw and raw[key] is None:
                d[key] = False
        missing = [k for k in _REQUIRED_INTS if k not in raw or raw[k] is None]
        if missing:
            raise ConfigError(f"config.json lacks required key(s): {', '.join(missing)}")
        ints = {k: _positive_int(d, k) for k in _REQUIRED_INTS}
        ints["max_position_embeddings"] = _positive_int(d, "max_position_embeddings")
        q_lora_rank = d.get("q_lora_rank")
        if q_lora_rank is not None:
            q_lora_rank = _positive_int(d, "q_lora_rank")
        if d["hidden_act"] != "silu":
            raise ConfigError(f"hidden_act {d['hidden_act']!r} is not supported (DeepSeek models use 'silu')")
        if ints["qk_rope_head_dim"] % 2:
            raise ConfigError(f"qk_rope_head_dim must be even, got {ints['qk_rope_head_dim']}")
        rope = _rope_config(d, ints["qk_rope_head_dim"], ints["max_position_embeddings"])
        if rope.dim != ints["qk_rope_head_dim"]:
            raise ConfigError("partial_rotary_factor != 1 is not supported for MLA (k_pe is rotated whole)")
        if model_type == "deepseek_v2":
            rope_form = "complex"
        else:
            rope_form = "interleave" if d["rope_interleave"] else "half"
        eos_ids = _token_ids(d, "eos_token_id", ints["vocab_size"])
        bos_ids = _token_ids(d, "bos_token_id", ints["vocab_size"])
        if len(bos_ids) > 1:
            raise ConfigError(f"config.json: bos_token_id must be one integer, got {d['bos_token_id']!r}")
        return cls(
            model_type=model_type, num_layers=ints["num_hidden_layers"], hidden_size=ints["hidden_size"],
            num_heads=ints["num_attention_heads"], vocab_size=ints["vocab_size"], q_lora_rank=q_lora_rank,
            kv_lora_rank=ints["kv_lora_rank"], qk_nope_head_dim=ints["qk_nope_head_dim"],
            qk_rope_head_dim=ints["qk_rope_head_dim"], v_head_dim=ints["v_head_dim"],
            intermediate_size=ints["intermediate_size"], max_position_embeddings=ints["max_position_embeddings"],
            rms_norm_eps=_positive_float(d, "rms_norm_eps"), attention_bias=bool(d["attention_bias"]),
            mlp_bias=bool(d.get("mlp_bias", False)) and model_type == "deepseek_v2",
            tie_word_embeddings=bool(d["tie_word_embeddings"]), rope=rope, rope_form=rope_form,
            moe=_moe_config(d, model_type, ints), bos_token_id=d.get("bos_token_id"), eos_token_ids=eos_ids,
            raw=raw)


def _token_ids(d: dict, key: str, vocab: int) -> tuple[int, ...]:
    """An id or list of ids (or null), each an integer inside the vocabulary."""
    v = d.get(key)
    if v is None:
        return ()
    ids = v if isinstance(v, list) else [v]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ConfigError(f"config.json: {key} must be an integer or a list of integers, got {v!r}")
        if not 0 <= i < vocab:
            raise ConfigError(f"config.json: {key} {i} is outside the vocabulary [0, {vocab})")
    return tuple(ids)


def _positive_int(d: dict, key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _positive_float(d: dict, key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"config.json: {key} must be a positive number, got {v!r}")
    return float(v)


def _rope_config(d: dict, rope_dim: int, max_pos: int) -> RopeConfig:
    """rope_parameters (transformers 5 form) or the legacy rope_theta + rope_scaling keys. As
    transformers 5.24 reads them: rope_scaling wins when both are given, and a top-level
    original_max_position_embeddings wins over the rope dict's."""
    params = d.get("rope_scaling") or d.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config.json: rope_parameters must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    dim = int(rope_dim * partial)
    if not isinstance(theta, (int, float)) or theta <= 1:
        raise ConfigError(f"config.json: rope_theta must be a number > 1, got {theta!r}")
    if rope_type == "default":
        return RopeConfig("default", float(theta), dim)
    if rope_type != "yarn":
        raise ConfigError(f"rope type {rope_type!r} is not supported (DeepSeek models use 'default' or 'yarn')")
    orig = d.get("original_max_position_embeddings")
    if orig is None:
        orig = params.get("original_max_position_embeddings", max_pos)
    factor = params.get("factor")
    if factor is None:  # transformers derives it from the two lengths then
        factor = max_pos / orig
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise ConfigError(f"config.json: rope factor must be a positive number, got {factor!r}")

    def opt(key):
        v = params.get(key)
        return None if v is None else float(v)

    return RopeConfig("yarn", float(theta), dim, factor=float(factor), original_max_position_embeddings=int(orig),
                      beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                      mscale=opt("mscale"), mscale_all_dim=opt("mscale_all_dim"),
                      attention_factor=opt("attention_factor"), truncate=bool(params.get("truncate", True)))


def _moe_config(d: dict, model_type: str, ints: dict) -> MoEConfig:
    n_exp = _positive_int(d, "n_routed_experts")
    top_k = _positive_int(d, "num_experts_per_tok") if d.get("num_experts_per_tok") is not None else None
    first_dense = d.get("first_k_dense_replace")
    if not isinstance(first_dense, int) or first_dense < 0:
        raise ConfigError(f"config.json: first_k_dense_replace must be an integer >= 0, got {first_dense!r}")
    if top_k is None:
        if first_dense < ints["num_hidden_layers"]:
            raise ConfigError("config.json: num_experts_per_tok is required when there are MoE layers")
        top_k = 1
    shared = d.get("n_shared_experts") or 0
    if not isinstance(shared, int) or shared < 0:
        raise ConfigError(f"config.json: n_shared_experts must be an integer >= 0, got {shared!r}")
    if model_type == "deepseek_v3":
        scoring, method = "sigmoid", "noaux_tc"
        declared = d.get("scoring_func")
        if declared not in (None, "sigmoid"):
            raise ConfigError(f"scoring_func {declared!r} is not supported for deepseek_v3 (transformers uses sigmoid)")
        n_group, topk_group = _positive_int(d, "n_group"), _positive_int(d, "topk_group")
    else:
        scoring, method = "softmax", d.get("topk_method") or "greedy"
        declared = d.get("scoring_func")
        if declared not in (None, "softmax"):
            raise ConfigError(f"scoring_func {declared!r} is not supported for deepseek_v2 (transformers uses softmax)")
        if method not in ("greedy", "group_limited_greedy"):
            raise ConfigError(f"topk_method {method!r} is not supported for deepseek_v2 "
                              "(transformers knows 'greedy' and 'group_limited_greedy')")
        if method == "greedy":
            n_group, topk_group = 1, 1
        else:
            n_group, topk_group = _positive_int(d, "n_group"), _positive_int(d, "topk_group")
    if n_exp % n_group:
        raise ConfigError(f"n_routed_experts ({n_exp}) must be a multiple of n_group ({n_group})")
    if topk_group > n_group:
        raise ConfigError(f"topk_group ({topk_group}) must be <= n_group ({n_group})")
    if model_type == "deepseek_v3" and n_exp // n_group < 2:
        raise ConfigError("deepseek_v3 routing sums the top-2 scores of each group: "
                          f"n_routed_experts / n_group must be >= 2, got {n_exp // n_group}")
    if top_k > topk_group * (n_exp // n_group):
        raise ConfigError(f"num_experts_per_tok ({top_k}) exceeds the experts of the {topk_group} chosen group(s)")
    return MoEConfig(n_routed_experts=n_exp, num_experts_per_tok=top_k,
                     moe_intermediate_size=ints["moe_intermediate_size"], n_shared_experts=shared,
                     first_k_dense_replace=first_dense, routed_scaling_factor=float(d["routed_scaling_factor"]),
                     norm_topk_prob=bool(d["norm_topk_prob"]), scoring=scoring, topk_method=method,
                     n_group=n_group, topk_group=topk_group)
