"""`MLAModelConfig`: the facts of a DeepSeek-V2/V3-style checkpoint, read from its `config.json`.

The pinned transformers version (5.25) is the oracle for every formula here: a key missing from
`config.json` takes the default of transformers' own config class of that model type (each
family's file in `mla_export/families/` holds its defaults and what it reads differently from
DeepSeek-V3), and the derived values (RoPE frequencies, YaRN attention factor, softmax scale) are computed the
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

from .config_values import check_values
from ..formats.json_file import show
from ..families import Block, SparseAttention, family as _family, supported_model_types
from ..families.wrappers import unwrap
from ..formats.json_file import read_json

__all__ = ["ConfigError", "MLAModelConfig", "MoEConfig", "RopeConfig", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = supported_model_types()


class ConfigError(ValueError):
    """config.json describes a model this exporter cannot (or must not) convert."""


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str  # "default", "yarn" or "longrope"
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
    short_factor: tuple[float, ...] | None = None  # longrope: per-frequency divisors up to original_max
    long_factor: tuple[float, ...] | None = None  # longrope: beyond original_max_position_embeddings

    def inv_freq(self, long: bool = False) -> np.ndarray:
        """[dim // 2] float32 inverse frequencies, computed in float32 as transformers does
        (longrope: with the short factors, or the long ones when `long`)."""
        f32 = np.float32
        exponents = np.arange(0, self.dim, 2, dtype=np.int64).astype(f32) / f32(self.dim)
        # float64 pow rounded to float32 is within 1 ulp of torch's float32 pow (numpy's float32 power: 2 ulp)
        pos_freqs = np.power(np.float64(f32(self.theta)), exponents.astype(np.float64)).astype(f32)
        if self.rope_type == "default":
            return (f32(1.0) / pos_freqs).astype(f32)
        if self.rope_type == "longrope":
            ext = np.asarray(self.long_factor if long else self.short_factor, dtype=f32)
            return (f32(1.0) / (ext * pos_freqs)).astype(f32)
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
        if self.rope_type == "longrope":
            if self.attention_factor is not None:
                return float(self.attention_factor)
            if self.factor <= 1.0:
                return 1.0
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))
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
    scoring: str  # "sigmoid" (V3, with e_score_correction_bias) or "softmax" (V2, Mistral 4)
    topk_method: str  # V3: "noaux_tc"; V2: "greedy", "group_limited_greedy"; Mistral 4: "group_top2";
    # LongCat-Flash: "zero_experts" (softmax + correction bias over real and identity experts)
    n_group: int
    topk_group: int
    zero_experts: int = 0  # LongCat-Flash: router ids >= n_routed_experts are identity experts


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
    moe: MoEConfig | None  # None: a family without experts (every layer dense)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    family: str = "deepseek_v3"  # the mla_export.families entry that read it
    mlp_layer_types: tuple[str, ...] = ()  # "dense" or "moe" per layer
    block: dict = field(compare=False, default_factory=Block)  # per-family block facts (families/base.py)
    sparse: SparseAttention | None = None  # DeepSeek Sparse Attention's indexer (families/dsa.py); None: dense
    # A multimodal checkpoint's text tower: where its weights sit (families/wrappers.py; CheckpointReader)
    weight_prefixes: tuple | None = field(default=None, compare=False)

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

    @property
    def fp8_block(self) -> tuple[int, int] | None:
        """(rows, cols) of the checkpoint's FP8 weight blocks, None for a float checkpoint."""
        quant = self.raw.get("quantization_config")
        return fp8_block_size(quant, ConfigError) if isinstance(quant, dict) else None

    def is_moe_layer(self, layer: int) -> bool:
        return self.mlp_layer_types[layer] == "moe"

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
                    n_routed_experts=self.moe.n_routed_experts if self.moe else 0,
                    num_experts_per_tok=self.moe.num_experts_per_tok if self.moe else 0, family=self.family,
                    sparse_attention=self.sparse.facts() if self.sparse else None)

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
        outer = raw
        raw, prefixes = unwrap(raw, ConfigError)  # a multimodal checkpoint's text tower (families/wrappers.py)
        model_type = raw.get("model_type")
        try:
            fam = _family(model_type)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        quant = raw.get("quantization_config")
        if quant:
            qm = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
            if not (isinstance(quant, dict) and fp8_block_size(quant, ConfigError) is not None):
                raise ConfigError(f"quantized checkpoints are not supported (quantization_config.quant_method="
                                  f"{qm!r}); FP8 checkpoints with block scales (DeepSeek's) are read directly, "
                                  "others need converting to bf16/f16/f32 first")
        d = {**fam.defaults, **{k: v for k, v in raw.items() if v is not None or k == "q_lora_rank"}}
        # transformers keeps an explicit null (its configs are dataclasses) and tests these two
        # for truth: null means rotate-half RoPE and no top-k renormalisation, not the default.
        for key in ("rope_interleave", "norm_topk_prob"):
            if key in raw and raw[key] is None:
                d[key] = False
        check_values(d, ConfigError)  # types and sane ranges, before anything is derived from them
        d = fam.prepare(d, ConfigError)
        missing = [k for k in fam.required if d.get(k) is None]
        if missing:
            raise ConfigError(f"config.json lacks required key(s): {', '.join(missing)}")
        ints = {k: _positive_int(d, k) for k in fam.required}
        ints["v_head_dim"] = _positive_int(d, "v_head_dim")
        ints["max_position_embeddings"] = _positive_int(d, "max_position_embeddings")
        q_lora_rank = d.get("q_lora_rank")
        if q_lora_rank is not None:
            q_lora_rank = _positive_int(d, "q_lora_rank")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config.json: hidden_act {show(d['hidden_act'])} is not supported "
                              "(these MLA models use 'silu')")
        if ints["qk_rope_head_dim"] % 2:
            raise ConfigError(f"qk_rope_head_dim must be even, got {ints['qk_rope_head_dim']}")
        rope = _rope_config(d, fam.rope_head_dim(d, ints), ints["max_position_embeddings"])
        if rope.dim != ints["qk_rope_head_dim"]:
            raise ConfigError(f"RoPE rotates {rope.dim} values (partial_rotary_factor) but qk_rope_head_dim is "
                              f"{ints['qk_rope_head_dim']}: MLA rotates the rope part of each head whole")
        layer_types = fam.mlp_layer_types(d, ints, ConfigError)
        moe = None
        if fam.has_moe and "moe" in layer_types:
            ints["moe_intermediate_size"] = _positive_int(d, "moe_intermediate_size")
            try:
                scoring, method = fam.router(d)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            moe = _moe_config(d, scoring, method, ints)
        eos_ids = _token_ids(d, "eos_token_id", ints["vocab_size"])
        bos_ids = _token_ids(d, "bos_token_id", ints["vocab_size"])
        if len(bos_ids) > 1:
            raise ConfigError(f"config.json: bos_token_id must be one integer, got {d['bos_token_id']!r}")
        return cls(
            model_type=outer["model_type"], num_layers=ints["num_hidden_layers"], hidden_size=ints["hidden_size"],
            num_heads=ints["num_attention_heads"], vocab_size=ints["vocab_size"], q_lora_rank=q_lora_rank,
            kv_lora_rank=ints["kv_lora_rank"], qk_nope_head_dim=ints["qk_nope_head_dim"],
            qk_rope_head_dim=ints["qk_rope_head_dim"], v_head_dim=ints["v_head_dim"],
            intermediate_size=ints["intermediate_size"], max_position_embeddings=ints["max_position_embeddings"],
            rms_norm_eps=_positive_float(d, "rms_norm_eps"), attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=fam.mlp_bias(d), tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), rope=rope,
            rope_form=fam.rope_form(d), moe=moe, bos_token_id=bos_ids[0] if bos_ids else None, eos_token_ids=eos_ids,
            raw=raw, family=fam.name, mlp_layer_types=layer_types, block=fam.block(d, ints, ConfigError),
            sparse=fam.sparse_attention(d, ints, ConfigError),
            weight_prefixes=prefixes)


def fp8_block_size(quant: dict, error=ValueError) -> tuple[int, int] | None:
    """(rows, cols) of DeepSeek's FP8 weight blocks when `quantization_config` describes them
    (`quant_method: fp8`, e4m3 codes, a `weight_scale_inv` per block), else None."""
    if quant.get("quant_method") != "fp8":
        return None
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise error(f"config.json: quantization_config.fmt {fmt!r} is not supported (FP8 checkpoints use e4m3)")
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        raise error(f"config.json: quantization_config.activation_scheme {quant.get('activation_scheme')!r} is "
                    "not supported (static activation scales change the math; DeepSeek's checkpoints say dynamic)")
    block = quant.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in block)):
        raise error(f"config.json: quantization_config.weight_block_size must be two positive integers, got {block!r}")
    return int(block[0]), int(block[1])


def _token_ids(d: dict, key: str, vocab: int) -> tuple[int, ...]:
    """An id or list of ids (or null), each an integer inside the vocabulary."""
    v = d.get(key)
    if v is None:
        return ()
    ids = v if isinstance(v, list) else [v]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ConfigError(f"config.json: {key} must be an integer or a list of integers, got {show(v)}")
        if not 0 <= i < vocab:
            raise ConfigError(f"config.json: {key} {i} is outside the vocabulary [0, vocab_size = {vocab})")
    return tuple(ids)


def _positive_int(d: dict, key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"config.json: {key} must be a positive integer, got {show(v)}")
    return v


def _positive_float(d: dict, key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
        raise ConfigError(f"config.json: {key} must be a positive number, got {show(v)}")
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
    if rope_type == "longrope":
        return _longrope(d, params, float(theta), dim, max_pos)
    if rope_type != "yarn":
        block = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
        raise ConfigError(f"config.json: {block}.rope_type {show(rope_type)} is not supported (these MLA models use "
                          "'default', 'yarn' or 'longrope')")
    orig = d.get("original_max_position_embeddings")
    if orig is None:
        orig = params.get("original_max_position_embeddings")
    if orig is None:  # null as absent (transformers' default: the model's own context)
        orig = max_pos
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


def _longrope(d: dict, params: dict, theta: float, dim: int, max_pos: int) -> RopeConfig:
    """LongRoPE (MiniCPM3): per-frequency divisors, short ones up to original_max_position_embeddings
    and long ones beyond; cos/sin scaled by sqrt(1 + log(factor) / log(original)) (transformers)."""
    orig = params.get("original_max_position_embeddings", d.get("original_max_position_embeddings"))
    if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 1:
        raise ConfigError(f"config.json: rope_parameters (longrope) needs original_max_position_embeddings > 1, "
                          f"got {show(orig)}")
    factors = {}
    for key in ("short_factor", "long_factor"):
        v = params.get(key)
        if (not isinstance(v, list) or len(v) != dim // 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < 1e6 for x in v)):
            raise ConfigError(f"config.json: rope {key} must be {dim // 2} positive numbers below 1e6, got {show(v)}")
        factors[key] = tuple(float(x) for x in v)
    factor = params.get("factor")
    if factor is None:
        factor = max_pos / orig
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise ConfigError(f"config.json: rope factor must be a positive number, got {factor!r}")
    att = params.get("attention_factor")
    return RopeConfig("longrope", theta, dim, factor=float(factor), original_max_position_embeddings=orig,
                      attention_factor=None if att is None else float(att), **factors)


def _moe_config(d: dict, scoring: str, method: str, ints: dict) -> MoEConfig:
    n_exp = _positive_int(d, "n_routed_experts")
    top_k = _positive_int(d, "num_experts_per_tok")
    shared = d.get("n_shared_experts") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise ConfigError(f"config.json: n_shared_experts must be an integer >= 0, got {shared!r}")
    zero = d.get("zero_expert_num") or 0 if method == "zero_experts" else 0
    if isinstance(zero, bool) or not isinstance(zero, int) or zero < 0:
        raise ConfigError(f"config.json: zero_expert_num must be an integer >= 0, got {zero!r}")
    if method in ("greedy", "zero_experts"):
        n_group, topk_group = 1, 1
    else:
        n_group, topk_group = _positive_int(d, "n_group"), _positive_int(d, "topk_group")
    if n_exp % n_group:
        raise ConfigError(f"n_routed_experts ({n_exp}) must be a multiple of n_group ({n_group})")
    if topk_group > n_group:
        raise ConfigError(f"topk_group ({topk_group}) must be <= n_group ({n_group})")
    if method in ("noaux_tc", "group_top2") and n_exp // n_group < 2:
        raise ConfigError("this router sums the top-2 scores of each group: "
                          f"n_routed_experts / n_group must be >= 2, got {n_exp // n_group}")
    if top_k > topk_group * (n_exp // n_group) + zero:
        raise ConfigError(f"num_experts_per_tok ({top_k}) exceeds the experts of the {topk_group} chosen group(s)")
    first = d.get("first_k_dense_replace")
    return MoEConfig(n_routed_experts=n_exp, num_experts_per_tok=top_k,
                     moe_intermediate_size=ints["moe_intermediate_size"], n_shared_experts=shared,
                     first_k_dense_replace=first if isinstance(first, int) else 0,
                     routed_scaling_factor=float(d["routed_scaling_factor"]),
                     norm_topk_prob=bool(d.get("norm_topk_prob", False)), scoring=scoring, topk_method=method,
                     n_group=n_group, topk_group=topk_group, zero_experts=zero)
