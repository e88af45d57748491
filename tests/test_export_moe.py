"""The routed experts' two graph forms (mla_export/export/moe.py), f32 weights and cache.

- grouped (the default): one sort, one Split, per-expert Gemms, ONE ScatterND(add) per MoE layer
  in the compiled IR (the old form had 64 NonZero/ScatterND chains per layer);
- gather_matmul (--moe-form gather-matmul): the CPU plugin fuses it into three GatherMatmul
  nodes per layer (no Tile, no dense all-experts MatMul left);
both against transformers' logits (max relative error 1e-4, same greedy tokens) through the
shared paged schedule (a full prefill, a chunk, a one-token prompt, decode batches) and a longer
prefill of two sequences (many tokens per expert, every expert used), for V2 softmax routing
(greedy and group-limited) and V3 sigmoid + bias + group routing.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, load_hf
from mla_export.export import ExportError, export_model
from mla_export.checkpoint.presets import make_checkpoint
from test_export_models import BLOCK, CONFIGS, NUM_BLOCKS, SCHEDULE, TOL, openvino_runner, portable_runner

MOE_CONFIGS = ["v3-qlora-yarn", "v2-lite-yarn", "v2-qlora"]  # V3 group routing, V2 greedy, V2 group-limited
LONG_PROMPTS = {"a": 40, "b": 27}
LONG_SCHEDULE = [[("a", 40), ("b", 27)], [("b", None), ("a", None)]]


@pytest.fixture(scope="module", params=MOE_CONFIGS)
def exported(request, tmp_path_factory):
    """One checkpoint exported twice: default (grouped IR) and gather_matmul IR + ONNX outputs."""
    model_type, overrides = CONFIGS[request.param]
    base = tmp_path_factory.mktemp(f"moe-{request.param}")
    ckpt = make_checkpoint(base / "ckpt", model_type, seed=len(request.param) + 5, **overrides)
    outs = {}
    for form in ("grouped", "gather_matmul"):
        outs[form] = base / form
        export_model(ckpt, outs[form], fmt="both", portable=True, block_size=BLOCK, kv_dtype="f32",
                     weight_dtype="f32", moe_form=form)
    return ckpt, outs, load_hf(ckpt)


def _runtime_types(xml) -> collections.Counter:
    from mla_export import ov_core

    core = ov_core()
    compiled = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return collections.Counter(op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops())


def _num_moe_layers(hf) -> int:
    cfg = hf.config
    return sum(i >= cfg.first_k_dense_replace for i in range(cfg.num_hidden_layers))


def test_gather_matmul_form_is_fused(exported):
    _, outs, hf = exported
    types = _runtime_types(outs["gather_matmul"] / "openvino_model.xml")
    assert types["GatherMatmul"] == 3 * _num_moe_layers(hf), types  # gate, up, down of the selected experts
    assert types["NonZero"] == 0 and types["Tile"] == 0 and types["ScatterNDUpdate"] == 0, types


def test_grouped_form_has_one_dispatch_per_layer(exported):
    _, outs, hf = exported
    types = _runtime_types(outs["grouped"] / "openvino_model.xml")
    assert types["NonZero"] == 0 and types["GatherMatmul"] == 0, types
    assert types["ScatterNDUpdate"] == _num_moe_layers(hf), types  # one scatter-add per layer, not per expert


@pytest.mark.parametrize("form", ["grouped", "gather_matmul"])
@pytest.mark.parametrize("schedule", ["mixed", "long-prefill"])
def test_ir_matches_transformers(exported, form, schedule, rng):
    _, outs, hf = exported
    cfg = hf.config
    run, _ = openvino_runner(outs[form] / "openvino_model.xml", cfg.num_hidden_layers,
                             cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    lens, steps = ({"a": 9, "b": 11, "c": 1}, SCHEDULE) if schedule == "mixed" else (LONG_PROMPTS, LONG_SCHEDULE)
    prompts = {s: np.random.default_rng(17).integers(2, cfg.vocab_size, n) for s, n in lens.items()}
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, steps, TOL)
    assert stats["agree"] == stats["total"], f"greedy tokens differ: {stats}"


def test_onnx_beside_gather_matmul_ir(exported, rng):
    """With the gather_matmul IR, model.onnx / model_portable.onnx keep the grouped form, reading
    each expert's slice of the stacked weights: the data file holds the experts once."""
    import onnx

    _, outs, hf = exported
    cfg = hf.config
    def stored(out):  # initializer name -> bytes in the data file, as model.onnx lists them
        inits = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer
        return {t.name: int({e.key: e.value for e in t.external_data}["length"]) for t in inits
                if t.data_location == onnx.TensorProto.EXTERNAL}

    grouped, stacked = stored(outs["grouped"]), stored(outs["gather_matmul"])
    assert sum(stacked.values()) == sum(grouped.values())  # the same weights, once each
    names = set(stacked)
    assert not any(".experts.0." in n for n in names) and any(n.endswith("experts.down_proj.stacked") for n in names)
    assert not (outs["gather_matmul"] / "openvino_source.onnx").exists()  # the IR's source is not kept
    run, _ = portable_runner(outs["gather_matmul"] / "model_portable.onnx", cfg.num_hidden_layers,
                             cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    prompts = {s: np.random.default_rng(5).integers(2, cfg.vocab_size, n) for s, n in {"a": 9, "b": 11, "c": 1}.items()}
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, SCHEDULE, TOL)
    assert stats["agree"] == stats["total"]


def test_bad_moe_form(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=3)
    with pytest.raises(ExportError, match="--moe-form must be one of auto, grouped, gather-matmul, fused"):
        export_model(ckpt, tmp_path / "out", moe_form="dense")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weight_format,code", [("int8", "u8"), ("int4", "u4")])
def test_compressed_experts_stay_compressed(tmp_path, weight_format, code):
    """int8/int4 exports: the gather_matmul form's three GatherMatmul per layer and the grouped
    form's expert Gemms read the u8/u4 codes (decompressed on the fly, never widened to f32)."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=13)
    n_moe = None
    for form in ("gather_matmul", "grouped"):
        out = tmp_path / form
        export_model(ckpt, out, fmt="openvino", kv_dtype="f32", weight_format=weight_format, group_size=32,
                     moe_form=form)
        from mla_export import ov_core

        core = ov_core()
        compiled = core.compile_model(core.read_model(str(out / "openvino_model.xml")), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"})
        weights_of = collections.Counter()
        for op in compiled.get_runtime_model().get_ops():
            kind = op.get_rt_info()["layerType"].astype(str)
            if kind in ("GatherMatmul", "FullyConnected"):
                src = op.input(1).get_source_output().get_node()
                weights_of[(kind, src.get_rt_info()["outputPrecisions"].astype(str))] += 1
        if n_moe is None:
            from mla_export.checkpoint.config import MLAModelConfig

            cfg = MLAModelConfig.from_dir(ckpt)
            n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
        f32_matmuls = weights_of[("FullyConnected", "f32")]
        assert f32_matmuls == n_moe, weights_of  # the routers only (transformers keeps them f32)
        if form == "gather_matmul":
            assert weights_of[("GatherMatmul", code)] == 3 * n_moe, weights_of


def test_expert_row_counts_stay_exact_at_bf16_precision(tmp_path, rng):
    """Rows per expert are counted in int32: at bf16 inference precision (the runtime's default, real
    bf16 on CPUs with AVX512-BF16/AMX) a float count above 256 rounds to an even number, and the
    Split then misses the row count. Two experts, both chosen by every token: each gets all 501 rows."""
    from mla_export import ov_core
    from mla_export.ops.cache_binding import cache_binding

    ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=4, n_routed_experts=2, num_experts_per_tok=2,
                           n_group=1, topk_group=1)
    out = tmp_path / "out"
    export_model(ckpt, out, fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_dtype="f32")
    core = ov_core()
    compiled = core.compile_model(core.read_model(str(out / "openvino_model.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "bf16"})
    hf_cfg = load_hf(ckpt).config
    width = hf_cfg.kv_lora_rank + hf_cfg.qk_rope_head_dim
    n = 501
    blocks = -(-n // BLOCK) + 1
    caches = [np.full((blocks, BLOCK, width), np.nan, np.float32) for _ in range(hf_cfg.num_hidden_layers)]
    session = PagedSession(BLOCK, blocks, rng)
    session.add("a", rng.integers(2, hf_cfg.vocab_size, n))
    feeds = dict(session.step_feeds([("a", n)]), **{f"kv_cache.{i}": cache_binding(c) for i, c in enumerate(caches)})
    logits = compiled.create_infer_request().infer(feeds, share_inputs=True)[compiled.output("logits")]
    assert logits.shape == (1, hf_cfg.vocab_size) and np.isfinite(logits).all()
