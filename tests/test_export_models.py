"""Exported tiny DeepSeek-V2/V3 models against transformers' own forward.

Each checkpoint is made with transformers' classes (random weights) and exported once with
--format both --portable; then the same paged schedule runs through the OpenVINO IR, the ONNX
graph read by OpenVINO (both with the MLA extension, f32 inference precision) and the portable
ONNX graph in plain onnxruntime: one step mixing a full prefill, a prefill chunk and a one-token
prompt, a step finishing the chunk while the others decode, then decode steps. Block tables are
shuffled, and cache rows no sequence owns start as NaN. Every row's logits must be within 1e-4
(max relative error) of transformers' and give the same greedy token.
"""

from __future__ import annotations

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, load_hf
from mla_export.export import export_model
from mla_export.checkpoint.presets import make_checkpoint

BLOCK = 4
NUM_BLOCKS = 24
TOL = 1e-4

NO_YARN = dict(rope_type="default", rope_theta=10000.0)
CONFIGS = {
    # the tiny preset: q_lora, YaRN (mscale_all_dim), interleaved RoPE, group-limited sigmoid routing
    "v3-qlora-yarn": ("deepseek_v3", {}),
    # no q_lora, plain RoPE in rotate-half layout, ungrouped routing without normalisation, 2 dense layers
    "v3-noqlora-half": ("deepseek_v3", dict(q_lora_rank=None, rope_interleave=False, rope_parameters=NO_YARN,
                                            n_group=1, topk_group=1, norm_topk_prob=False, first_k_dense_replace=2,
                                            n_routed_experts=6, num_experts_per_tok=3)),
    # V2-Lite-like: no q_lora, greedy softmax routing, YaRN, biases on the attention projections
    "v2-lite-yarn": ("deepseek_v2", dict(q_lora_rank=None, topk_method="greedy", attention_bias=True,
                                         n_shared_experts=2)),
    # V2-like: q_lora, group-limited greedy routing, plain RoPE, MLP biases
    "v2-qlora": ("deepseek_v2", dict(rope_parameters=NO_YARN, mlp_bias=True, n_group=4, topk_group=2)),
}

PROMPT_LENS = {"a": 9, "b": 11, "c": 1}
# (sequence, tokens to run; None = one decode token)
SCHEDULE = [
    [("a", 9), ("b", 6), ("c", 1)],        # full prefill, a chunk, a one-token prompt
    [("b", 5), ("a", None), ("c", None)],  # b's second chunk while the others decode
    [("c", None), ("a", None), ("b", None)],
    [("a", None), ("b", None)],
    [("b", None), ("c", None), ("a", None)],
]


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request, tmp_path_factory):
    model_type, overrides = CONFIGS[request.param]
    base = tmp_path_factory.mktemp(request.param)
    ckpt = make_checkpoint(base / "ckpt", model_type, seed=len(request.param), **overrides)
    out = base / "out"
    export_model(ckpt, out, fmt="both", portable=True, block_size=BLOCK, kv_dtype="f32", weight_dtype="f32")
    return ckpt, out, load_hf(ckpt)


def _prompts(seed: int, vocab: int) -> dict:
    rng = np.random.default_rng(seed)
    return {s: rng.integers(2, vocab, n) for s, n in PROMPT_LENS.items()}


def openvino_runner(path, num_layers: int, width: int, dtype=np.float32):
    from mla_export import ov_core
    from mla_export.ops.cache_binding import cache_binding

    core = ov_core()
    # f32 everywhere: no bf16 compute, and no dynamic int8 quantization of the activations that the
    # plugin applies to compressed-weight matmuls on CPUs with VNNI (exactness, not speed, is tested).
    compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    caches = [np.full((NUM_BLOCKS, BLOCK, width), np.nan, dtype) for _ in range(num_layers)]
    request = compiled.create_infer_request()

    def run(feeds):
        feeds = dict(feeds, **{f"kv_cache.{i}": cache_binding(c) for i, c in enumerate(caches)})
        result = request.infer(feeds, share_inputs=True)  # caches stay referenced by `caches`
        return result[compiled.output("logits")].copy()

    return run, caches


def portable_runner(path, num_layers: int, width: int):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    caches = [np.full((NUM_BLOCKS, BLOCK, width), np.nan, np.float32) for _ in range(num_layers)]

    def run(feeds):
        outs = sess.run(None, dict(feeds, **{f"kv_cache.{i}": c for i, c in enumerate(caches)}))
        caches[:] = outs[1:]
        return outs[0]

    return run, caches


@pytest.mark.parametrize("backend", ["openvino-ir", "onnx-in-openvino", "portable-onnxruntime"])
def test_matches_transformers(exported, backend, rng):
    ckpt, out, hf = exported
    cfg = hf.config
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    maker, file = {"openvino-ir": (openvino_runner, "openvino_model.xml"),
                   "onnx-in-openvino": (openvino_runner, "model.onnx"),
                   "portable-onnxruntime": (portable_runner, "model_portable.onnx")}[backend]
    run, caches = maker(out / file, cfg.num_hidden_layers, width)
    session = PagedSession(BLOCK, NUM_BLOCKS, rng)
    stats = drive_and_compare(run, hf, session, _prompts(7, cfg.vocab_size), SCHEDULE, TOL)
    assert stats["agree"] == stats["total"], f"greedy tokens differ: {stats}"
    # The cache holds exactly the written rows: every slot a sequence owns is finite, the rest untouched NaN.
    owned = np.zeros((NUM_BLOCKS, BLOCK), dtype=bool)
    for seq, blocks in session.blocks.items():
        n = session.cached[seq]
        pos = np.arange(n)
        owned[np.asarray(blocks)[pos // BLOCK], pos % BLOCK] = True
    for c in caches:
        assert np.isfinite(c[owned]).all() and np.isnan(c[~owned]).all()


def _round_stored_weights_to_bf16(hf) -> None:
    """Round in transformers' model exactly the tensors the export stores in --weight-dtype
    (projections, experts, embeddings, lm_head); norms, biases and the router stay f32."""
    import torch

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("proj.weight", "proj", "proj_with_mqa.weight", "embed_tokens.weight", "lm_head.weight")):
                p.copy_(p.to(torch.bfloat16).float())
    hf.__dict__.pop("_last_logits_memo", None)


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_bf16_weights_and_cache(tmp_path, rng, kv_dtype):
    import ml_dtypes

    ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=11)
    out = tmp_path / "out"
    export_model(ckpt, out, fmt="openvino", block_size=BLOCK, kv_dtype=kv_dtype, weight_dtype="bf16")
    hf = load_hf(ckpt)
    _round_stored_weights_to_bf16(hf)
    cfg = hf.config
    dtype = np.float32 if kv_dtype == "f32" else ml_dtypes.bfloat16
    run, caches = openvino_runner(out / "openvino_model.xml", cfg.num_hidden_layers,
                                  cfg.kv_lora_rank + cfg.qk_rope_head_dim, dtype)
    # bf16 weights are exact (the same rounded values in both); a bf16 cache rounds every row.
    tol = TOL if kv_dtype == "f32" else 2e-2
    session = PagedSession(BLOCK, NUM_BLOCKS, rng)
    stats = drive_and_compare(run, hf, session, _prompts(3, cfg.vocab_size), SCHEDULE, tol)
    if kv_dtype == "f32":
        assert stats["agree"] == stats["total"]
    # Written in place into our arrays (bf16 bound as u8 bytes): one finite row per cached token.
    written = sum(int(np.isfinite(c.astype(np.float32)).all(axis=-1).sum()) for c in caches)
    assert written == cfg.num_hidden_layers * sum(session.cached.values())
