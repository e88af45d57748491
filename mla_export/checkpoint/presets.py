"""Tiny random-weight checkpoints: with transformers' own DeepSeek classes (`make_checkpoint`,
torch; the tests' oracle checkpoints), or with numpy alone (`make_numpy_checkpoint`, what the
`tiny` preset uses, so that exporting it needs no torch).

`make_checkpoint(out_dir, model_type="deepseek_v3", seed=0, **overrides)` writes a Hugging Face
checkpoint directory (config.json, model.safetensors, generation_config.json) plus a small
byte-level BPE tokenizer trained with the `tokenizers` library on a built-in text, so that text
in and text out work end to end. The same seed gives the same files. `overrides` are config
keys (e.g. `q_lora_rank=None`, `rope_parameters={...}`, `n_routed_experts=4`).

The `tiny` preset (`mla-export export --preset tiny`) is `make_numpy_checkpoint(dir)` with the
defaults below: a real DeepseekV3 config (q_lora, YaRN, interleaved RoPE, a dense first layer
and MoE layers with group-limited routing and a shared expert), only small.

Random weights are drawn with a larger spread than transformers' init (std 0.02 gives nearly
uniform logits and near-tied router scores, which would make greedy tokens and expert choices
hinge on the last bits), and norm weights and the router bias are perturbed away from their
1/0 init so that a graph that drops one of them cannot pass a test.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["make_checkpoint", "make_numpy_checkpoint", "tiny_config", "train_tokenizer", "PRESETS", "BOS", "EOS"]

BOS, EOS = "<|bos|>", "<|eos|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

_TEXT = """\
The quick brown fox jumps over the lazy dog. A paged cache keeps the keys and values of every
sequence in fixed-size blocks, and a block table says where each block lives. Multi-head latent
attention stores one compressed row per token instead of one key and one value per head, so the
cache is many times smaller. The model reads the rows of a sequence through its block table,
scores them against the query, and mixes the latent values with the softmax weights.
Once upon a time there was a small model that wanted to speak. It learned the letters first,
then the words, then whole sentences: hello, world, how are you, I am fine, thank you.
Numbers too: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14 2.71. Questions and answers,
lists and code: def add(a, b): return a + b. for i in range(10): print(i).
User: What is the capital of France? Assistant: Paris is the capital of France.
User: Tell me a story. Assistant: Once there was a fox who lived near a river.
"""


def tiny_config(model_type: str = "deepseek_v3", **overrides) -> dict:
    """The tiny preset's config keys (transformers constructor arguments)."""
    if model_type in MULTIMODAL:  # a text tower (one of ours) beside a tiny vision tower
        text_type, vision, extra = MULTIMODAL[model_type]
        text = dict(tiny_config(text_type), model_type=text_type)
        text.update(overrides.pop("text_config", {}))
        return dict(text_config=text, vision_config=dict(vision), **extra, **overrides)
    common = dict(
        vocab_size=384, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.08,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=128, beta_fast=32, beta_slow=1,
                             mscale=1.0, mscale_all_dim=1.0),
    )
    if model_type not in FAMILY_CONFIGS:
        raise ValueError(f"make_checkpoint: model_type must be one of {', '.join(FAMILY_CONFIGS)}, got {model_type!r}")
    common.update(FAMILY_CONFIGS[model_type])
    for key in _NOT_KEYS.get(model_type, ()):
        common.pop(key, None)
    common.update(overrides)
    return common


_V3_ROUTING = dict(n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True)
# Each family's tiny keys on top of the common ones: what makes every difference of the family show.
FAMILY_CONFIGS = {
    "deepseek_v3": _V3_ROUTING,
    "deepseek_v2": dict(topk_method="group_limited_greedy", n_group=2, topk_group=1, routed_scaling_factor=1.5),
    # Kimi K2: V3's classes under its own model_type (one expert group, as the released config)
    "kimi_k2": dict(_V3_ROUTING, n_group=1, topk_group=1, routed_scaling_factor=2.827),
    "glm4_moe_lite": dict(_V3_ROUTING, mlp_layer_types=["dense", "sparse", "sparse"], rms_norm_eps=1e-5),
    "sarvam_mla": dict(_V3_ROUTING, n_group=1, topk_group=1, q_lora_rank=None),
    "youtu": dict(rope_interleave=True, tie_word_embeddings=True),
    "axk1": dict(_V3_ROUTING, mlp_layer_types=["dense", "sparse", "sparse"]),
    "minicpm3": dict(scale_emb=12, scale_depth=1.4, dim_model_base=16, tie_word_embeddings=True, rms_norm_eps=1e-5,
                     rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=512,
                                          short_factor=[1.0 + 0.15 * i for i in range(8)],
                                          long_factor=[2.0 + 0.5 * i for i in range(8)])),
    "mistral4": dict(n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True, rope_interleave=True,
                     first_k_dense_replace=1, max_position_embeddings=512,
                     # original_max 4 so that the tests' positions cross several query-scale steps
                     rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                          original_max_position_embeddings=4, beta_fast=32.0, beta_slow=1.0,
                                          mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)),
    # DeepSeek Sparse Attention: top-16 of every token's context (the tests run sequences far longer)
    "deepseek_v32": dict(_V3_ROUTING, index_topk=16, index_head_dim=32, index_n_heads=16),
    # GLM-5: interleaved indexer RoPE; layer 1 shares layer 0's selection
    "glm_moe_dsa": dict(_V3_ROUTING, n_group=1, topk_group=1, index_topk=16, index_head_dim=32, index_n_heads=16,
                        indexer_types=["full", "shared", "full"], mlp_layer_types=["dense", "sparse", "sparse"]),
    # two decoder layers = four latent cache layers; 2 identity experts beside 6 real ones
    "longcat_flash": dict(num_layers=2, ffn_hidden_size=128, moe_topk=3, n_routed_experts=6, zero_expert_num=2,
                          expert_ffn_hidden_size=32, routed_scaling_factor=2.0, head_dim=16),
}
_MOE_KEYS = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
             "moe_intermediate_size")
# keys the family's transformers config class does not take (strict dataclasses refuse them)
_NOT_KEYS = {"youtu": _MOE_KEYS, "minicpm3": _MOE_KEYS, "glm4_moe_lite": ("first_k_dense_replace",),
             "deepseek_v32": ("rope_interleave",), "glm_moe_dsa": ("rope_interleave", "first_k_dense_replace"),
             "axk1": ("first_k_dense_replace",),
             "longcat_flash": ("n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_intermediate_size",
                               "num_hidden_layers", "intermediate_size")}
# multimodal model types: (their text tower's model type, a tiny vision config, other keys)
MULTIMODAL = {
    "mistral3": ("mistral4", dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, image_size=32, patch_size=16, head_dim=16),
                 dict(image_token_index=10, spatial_merge_size=1, tie_word_embeddings=False)),
}
# model types transformers has no class for: (the class's model_type, what config.json then says)
SAVED_AS = {"kimi_k2": "deepseek_v3"}


def train_tokenizer(vocab_size: int, text: str = _TEXT):
    """A byte-level BPE `tokenizers.Tokenizer` with BOS (id 0) and EOS (id 1); encode() adds BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0), (EOS, 1)])
    return tok


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    tok = train_tokenizer(vocab_size)
    assert tok.get_vocab_size() <= vocab_size, "the tokenizer must fit the model's vocabulary"
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", bos_token=BOS, eos_token=EOS, add_bos_token=True,
        add_eos_token=False, model_max_length=512, chat_template=CHAT_TEMPLATE), indent=2) + "\n")


def _perturb(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "rotary_emb" in name or name.endswith("embed_scale"):
                continue
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias") or name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def make_checkpoint(out_dir, model_type: str = "deepseek_v3", seed: int = 0, *, tokenizer: bool = True,
                    dtype: str = "float32", **overrides) -> Path:
    """Write a tiny random-weight checkpoint of `model_type` to `out_dir`; returns the path.

    dtype: the saved weights' dtype ("float32", "bfloat16" or "float16")."""
    import torch
    from transformers import AutoConfig

    cfg_dict = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(SAVED_AS.get(model_type, model_type), **cfg_dict)
    model = causal_lm_class(config)(config).eval()
    _perturb(model, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out)
    if _mtp_count(cfg_dict):
        _append_mtp_layers(out, model_type, cfg_dict, seed, dtype)
    if model_type in SAVED_AS:  # as the released config.json names it (transformers reads it as its class)
        path = out / "config.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), model_type=model_type), indent=2) + "\n")
    if tokenizer:
        _write_tokenizer(out, cfg_dict.get("vocab_size") or cfg_dict["text_config"]["vocab_size"])
    return out


def _mtp_count(cfg_dict: dict) -> int:
    from .writer import mtp_layers

    return mtp_layers(cfg_dict)


def _append_mtp_layers(out: Path, model_type: str, cfg_dict: dict, seed: int, dtype: str) -> None:
    """Add the config's MTP layers to out/model.safetensors as DeepSeek's (and GLM-5's) released
    checkpoints hold them, which transformers neither builds nor loads: layer N + j (N =
    num_hidden_layers) is a decoder layer of the model's own kind, made here by transformers' own
    classes (layer N + j of the same model built with more layers: a MoE layer; with sparse attention
    one with its own indexer, "full"), plus enorm, hnorm, eh_proj [H, 2H] and shared_head.{norm, head}
    drawn with numpy. The main model's tensors are left as they were written."""
    import tempfile

    import numpy as np
    import torch
    from transformers import AutoConfig

    from .reader import SafetensorsFile
    from .writer import save_safetensors

    n, m = cfg_dict["num_hidden_layers"], _mtp_count(cfg_dict)
    grown = dict(cfg_dict, num_hidden_layers=n + m)
    for key, extra in (("indexer_types", "full"), ("mlp_layer_types", "sparse")):
        if isinstance(grown.get(key), list):  # per-layer lists: the MTP layers run their own indexer, MoE
            grown[key] = grown[key] + [extra] * m
    torch.manual_seed(seed + 7919)
    config = AutoConfig.for_model(SAVED_AS.get(model_type, model_type), **grown)
    model = causal_lm_class(config)(config).eval()
    _perturb(model, seed + 7919)
    with tempfile.TemporaryDirectory() as tmp:
        model.to(getattr(torch, dtype)).save_pretrained(tmp)
        files = sorted(Path(tmp).glob("*.safetensors"))
        extra = {}
        for path in files:
            f = SafetensorsFile(path)
            extra.update({k: f.array(k) for k in f.entries if any(k.startswith(f"model.layers.{n + j}.")
                                                                  for j in range(m))})
            f.close()
    files = sorted(out.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"make_checkpoint: MTP layers are added to a single model.safetensors, found "
                         f"{len(files)} files")
    f = SafetensorsFile(files[0])
    tensors, metadata = {k: f.array(k) for k in f.entries}, f.metadata
    f.close()
    h, v = cfg_dict["hidden_size"], cfg_dict["vocab_size"]
    like = tensors["model.embed_tokens.weight"].dtype
    rng = np.random.default_rng(seed + 104729)
    std = float(cfg_dict.get("initializer_range", 0.02))
    for j in range(m):
        pre = f"model.layers.{n + j}"
        tensors.update({f"{pre}.enorm.weight": 1.0 + 0.2 * rng.standard_normal(h),
                        f"{pre}.hnorm.weight": 1.0 + 0.2 * rng.standard_normal(h),
                        f"{pre}.eh_proj.weight": std * rng.standard_normal((h, 2 * h))})
        tensors.update({k: t for k, t in extra.items() if k.startswith(f"{pre}.")})
        tensors.update({f"{pre}.shared_head.norm.weight": 1.0 + 0.2 * rng.standard_normal(h),
                        f"{pre}.shared_head.head.weight": std * rng.standard_normal((v, h))})
    tensors = {k: np.asarray(t).astype(like) if t.dtype != like else t for k, t in tensors.items()}
    save_safetensors(files[0], tensors, metadata)


def causal_lm_class(config):
    """transformers' causal-LM class of a config (some, e.g. Mistral 4, are missing from
    AutoModelForCausalLM's table in 5.25: then the `*ForCausalLM` class of the model's module)."""
    import importlib

    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    names = [n for n in dir(module) if n.endswith("ForCausalLM")]
    if not names:  # a multimodal model (Mistral 3): its generation class takes text-only input too
        names = [n for n in dir(module) if n.endswith("ForConditionalGeneration")]
    if len(names) != 1:
        raise ValueError(f"no single causal-LM class for {type(config).__name__} (AutoModelForCausalLM: "
                         f"{AutoModelForCausalLM.__name__}; found {names})")
    return getattr(module, names[0])


def make_numpy_checkpoint(out_dir, model_type: str = "deepseek_v3", seed: int = 0, *, tokenizer: bool = True,
                          dtype: str = "float32", **overrides) -> Path:
    """Like `make_checkpoint`, with numpy's random weights instead of torch's (same config, same
    tensor names and shapes; the values differ): needs neither torch nor transformers."""
    from .writer import write_random_checkpoint

    cfg_dict = tiny_config(model_type, **overrides)
    out = write_random_checkpoint(out_dir, model_type, seed, cfg_dict, dtype=dtype)
    if tokenizer:
        _write_tokenizer(out, cfg_dict.get("vocab_size") or cfg_dict["text_config"]["vocab_size"])
    return out


# The CLI's presets are written with numpy, so `mla-export export --preset tiny` needs no torch.
# tiny-mtp: the same model plus DeepSeek-V3's multi-token-prediction layer (its MTP draft is
# exported beside the model, for speculative decoding with method "mtp").
PRESETS = {"tiny": lambda out_dir: make_numpy_checkpoint(out_dir, "deepseek_v3", seed=0),
           "tiny-mtp": lambda out_dir: make_numpy_checkpoint(out_dir, "deepseek_v3", seed=0,
                                                             num_nextn_predict_layers=1)}
