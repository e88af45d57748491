"""The whole model as ONNX: inputs from the contract, embedding, decoder layers streamed one at a
time from the checkpoint, final norm on the rows `logits_indices` picks, lm_head.

`build_onnx(...)` writes `model.onnx` (custom MLA ops) and/or `model_portable.onnx` (portable
functions, updated caches as outputs) into a directory, both pointing at one external weights
file, and returns their paths. A third variant, "openvino" (`openvino_source.onnx`, custom MLA
ops), is the OpenVINO IR's source when the IR's MoE form or lm_head differs from model.onnx's (see
moe.py and `_logits`); the exporter deletes it after the conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import onnx
from onnx import TensorProto, helper

from ..ops import onnx_ops
from ..checkpoint.config import MLAModelConfig
from ..formats.contract import graph_io
from .graph import GraphBuilder, WeightFormat, WeightStore
from .layers import CUSTOM_OP_VARIANTS, attention, dense_mlp, norm, rope_tables
from .qlinear import qlinear, qlinear_problem
from .longcat_flash import SUBLAYERS as LONGCAT_SUBLAYERS, longcat_layer
from .moe import moe
from ..checkpoint.reader import CheckpointReader

__all__ = ["build_onnx", "plan_weights", "ONNX_FILES", "ONNX_DATA", "HIDDEN_OUTPUT"]

ONNX_FILES = {"custom": "model.onnx", "portable": "model_portable.onnx", "openvino": "openvino_source.onnx"}
ONNX_DATA = "model.onnx.data"
HIDDEN_OUTPUT = "hidden_states"
_ONNX_TYPES = {"f32": TensorProto.FLOAT, "bf16": TensorProto.BFLOAT16, "f16": TensorProto.FLOAT16,
               "i32": TensorProto.INT32, "i64": TensorProto.INT64, "u8": TensorProto.UINT8}


def _value_info(spec, vocab: int):
    shape = [vocab if d == "vocab" else d for d in spec.shape]
    return helper.make_tensor_value_info(spec.name, _ONNX_TYPES[spec.dtype], shape)


def build_onnx(cfg: MLAModelConfig, reader: CheckpointReader, out_dir: Path, *, variants: list[str],
               block_size: int, kv_dtype: str, weight_format: WeightFormat | str,
               moe_forms: dict[str, str] | None = None,
               progress: Callable[[int, int], None] | None = None, hidden_output: bool = False) -> dict[str, Path]:
    """moe_forms: variant -> MoE form ("grouped" or "gather_matmul"; default grouped everywhere).
    hidden_output: the graphs also return `hidden_states` (an export with an MTP draft: mtp.py)."""
    out_dir = Path(out_dir)
    store = WeightStore(out_dir / ONNX_DATA, weight_format)
    try:
        g = GraphBuilder(store, variants)
        _build(g, reader, cfg, progress, moe_forms, kv_dtype, hidden_output)
    finally:
        store.close()
    onnx_ops.register_schemas()
    paths = {}
    for variant in variants:
        index = (cfg.sparse.indexer_types.count("full"), cfg.sparse.index_head_dim) if cfg.sparse else None
        inputs, outputs = graph_io(cfg.num_layers, block_size, cfg.row_width, kv_dtype,
                                   "portable" if variant == "portable" else "custom", cfg.kv_lora_rank, index,
                                   cfg.hidden_size if hidden_output else None)
        graph = helper.make_graph(g.variants[variant], f"{cfg.model_type}_mla_{variant}",
                                  [_value_info(s, cfg.vocab_size) for s in inputs],
                                  [_value_info(s, cfg.vocab_size) for s in outputs],
                                  _used(store.initializers, g.variants[variant]))
        model = helper.make_model(graph, opset_imports=onnx_ops.opset_imports(variant == "portable"),
                                  producer_name="mla-export", ir_version=10)
        if variant == "portable":
            model.functions.extend(onnx_ops.portable_functions())
        path = out_dir / ONNX_FILES[variant]
        onnx.save_model(model, str(path))
        paths[variant] = path
    return paths


def _used(initializers, nodes) -> list:
    """The initializers a variant's nodes read (variants with different MoE forms share one
    weights file but not every constant)."""
    read = {name for node in nodes for name in node.input}
    return [t for t in initializers if t.name in read]


def plan_weights(cfg: MLAModelConfig, reader: CheckpointReader, weight_format: WeightFormat,
                 progress: Callable[[int, int], None] | None = None, moe_form: str = "grouped") -> None:
    """A pass over every weight that stores nothing: int4 sensitivities, then weight_format.plan().
    moe_form: the one the export writes (it decides the expert weights' names: stacked or per expert)."""
    import os

    weight_format.planning = True
    store = WeightStore(Path(os.devnull), weight_format)
    try:
        _build(GraphBuilder(store, ["custom"]), reader, cfg, progress, {"custom": moe_form})
    finally:
        store.close()
    weight_format.plan()


def _build(g: GraphBuilder, reader: CheckpointReader, cfg: MLAModelConfig,
           progress: Callable[[int, int], None] | None, moe_forms: dict[str, str] | None = None,
           kv_dtype: str = "", hidden_output: bool = False) -> None:
    io = _inputs(g, cfg)
    io["kv_dtype"] = kv_dtype  # the cache row format the MLA nodes read and write (kv_dtype attribute)
    h, table = _embed(g, reader, cfg)
    if cfg.block["embed_scale"] != 1.0:  # MiniCPM3's scale_emb (lm_head, when tied, reads the unscaled table)
        h = g.op("Mul", h, g.f32(cfg.block["embed_scale"]))
    layer, per_layer = LAYOUTS[cfg.block["layout"]]
    n = cfg.num_layers // per_layer  # decoder layers (num_layers counts latent cache layers)
    for i in range(n):
        h = layer(g, reader, cfg, i, h, io, moe_forms)
        if progress:
            progress(i + 1, n)
    if hidden_output:  # the MTP draft reads each token's last hidden state before the final norm
        g.op("Identity", h, name=HIDDEN_OUTPUT)
    picked = g.op("Gather", h, "logits_indices", axis=0)  # [B, hidden]: norm + lm_head on B rows only
    picked = norm(g, reader, "model.norm.weight", picked, cfg.hidden_size, cfg.rms_norm_eps)
    if cfg.block["logits_divisor"] != 1.0:  # MiniCPM3: hidden / (hidden_size / dim_model_base)
        picked = g.op("Div", picked, g.f32(cfg.block["logits_divisor"]))
    _logits(g, reader, cfg, picked, table, moe_forms)


def _inputs(g: GraphBuilder, cfg: MLAModelConfig, caches: list[str] | None = None) -> dict:
    """Graph-level values every layer shares: metadata names and the RoPE rows of `positions`.

    The custom-op graph starts with MlaStepCheck (the whole step validated before any cache byte
    moves); input_ids, positions and slot_mapping are read only through its outputs. The
    portable graph returns updated caches instead of writing its inputs, so a failing step
    leaves the caller's caches alone there; it passes the three through unchanged (Identity)."""
    ck = onnx_ops.CHECKED
    for variant in CUSTOM_OP_VARIANTS:  # both use the in-place MLA ops
        if variant in g.variants:
            g.add_node(variant, onnx_ops.step_check_node(cfg.num_layers, cfg.vocab_size, cfg.max_position_embeddings,
                                                         caches=caches))
    if "portable" in g.variants:
        for raw, checked in ck.items():
            g.add_node("portable", helper.make_node("Identity", [raw], [checked], name=f"{raw}.pass"))
    cos, sin = rope_tables(cfg)
    cos_k = g.op("Gather", g.f32_tensor("rope.cos", cos), ck["positions"], axis=0)  # [T, dr]
    sin_k = g.op("Gather", g.f32_tensor("rope.sin", sin), ck["positions"], axis=0)
    io = dict(slot_mapping=ck["slot_mapping"], query_start_loc="query_start_loc", seq_lens="seq_lens",
              block_tables="block_tables", cos_k=cos_k, sin_k=sin_k,
              cos_q=g.op("Unsqueeze", cos_k, g.i64(1)), sin_q=g.op("Unsqueeze", sin_k, g.i64(1)))
    if cfg.block["q_position_scale"] is not None:
        io["q_scale"] = _query_position_scale(g, ck["positions"], *cfg.block["q_position_scale"])
    return io


def _query_position_scale(g: GraphBuilder, positions: str, beta: float, original: float) -> str:
    """[T, 1, 1]: 1 + beta * log(1 + floor(position / original)) in float32, as transformers'
    `get_llama_4_attn_scale` (Mistral 4) computes it; the same for every layer."""
    pos = g.op("Cast", positions, to=TensorProto.FLOAT)
    steps = g.op("Floor", g.op("Div", pos, g.f32(original)))
    scale = g.op("Add", g.op("Mul", g.op("Log", g.op("Add", steps, g.f32(1.0))), g.f32(beta)), g.f32(1.0))
    return g.op("Reshape", scale, g.i64(-1, 1, 1))


def _embed(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig,
           name: str = "model.embed_tokens.weight") -> tuple[str, str]:
    """(the T embedding rows as f32, the table value lm_head can share when tied)."""
    table = rd.get(name, (cfg.vocab_size, cfg.hidden_size))
    fmt = g.store.format
    if fmt.bits("embedding", name) is None:
        fmt.record(fmt.float_dtype, table.size)
        stored = g.store.add(name, table, fmt.float_dtype)
        rows = g.op("Gather", stored, onnx_ops.CHECKED["input_ids"], axis=0)  # gather first, widen only the T rows
        if fmt.float_dtype == "f32":
            return rows, stored
        return g.op("Cast", rows, to=TensorProto.FLOAT), g.op("Cast", stored, to=TensorProto.FLOAT)
    # Quantized: the decompression chain sits on the whole table and the Gather follows, the form
    # the CPU plugin turns into one Gather over the compressed table (only T rows are decoded).
    deq = g.weight(name, table, kind="embedding")
    return g.op("Gather", deq, onnx_ops.CHECKED["input_ids"], axis=0), deq


def _logits(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, picked: str, table: str,
            moe_forms: dict[str, str] | None) -> None:
    """The `logits` node: our MlaQLinear where it is the faster or the only compact choice, else a Gemm.
    (The int4 projections follow the same rule: layers.linear.)

    lm_head multiplies only the B rows `logits_indices` picks (one per sequence of the step), so it
    is a decode-sized product at every step. model.onnx uses MlaQLinear wherever it already runs our
    integer-weight ops (the fused MoE form): onnxruntime would fold a dequantised Gemm into an f32
    copy of the table. The graph the IR is made from uses it for int4 and int8 heads: the plugin's
    compressed MatMul decodes every code to bf16 on each call, measured 1.7x slower than our VNNI
    dots at 1 row and even at 8 for int4, 1.35x slower at 1 row for int8 (1.1x faster at 8 rows;
    docs/WEIGHTS.md has the figures)."""
    fmt = g.store.format
    bits = fmt.bits("head", "lm_head.weight") if rd.has("lm_head.weight") else None  # else the table serves
    fused = {v for v, form in (moe_forms or {}).items() if form == "fused"}
    ours = [v for v in CUSTOM_OP_VARIANTS if v in g.variants and ((v == "custom" and v in fused) or bits in (4, 8))]
    counted = False
    if (ours and not fmt.planning and rd.has("lm_head.weight")
            and qlinear_problem(cfg.vocab_size, cfg.hidden_size, bits, fmt.group_size) is None):
        qlinear(g.only(ours), "lm_head.weight", rd.get("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)),
                picked, bits, "logits")
        g, counted = g.only([v for v in g.variants if v not in ours]), True
        if not g.variants:
            return
    g.op("Gemm", picked, _lm_head(g, rd, cfg, table, record=not counted), transB=1, name="logits")


def _lm_head(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, embedding: str, record: bool = True) -> str:
    if rd.has("lm_head.weight"):
        return g.weight("lm_head.weight", rd.get("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)), kind="head",
                        record=record)
    if cfg.tie_word_embeddings:  # the stored embedding table serves as lm_head
        return embedding
    return g.weight("lm_head.weight", rd.get("lm_head.weight"))  # raises the missing-tensor error


def decoder_layer(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, h: str, io: dict,
                   moe_forms: dict[str, str] | None) -> str:
    p = f"model.layers.{i}"
    scale = cfg.block["residual_scale"]  # MiniCPM3: scale_depth / sqrt(layers) on each sub-layer's output

    def residual(h: str, y: str) -> str:
        return g.op("Add", h, y if scale == 1.0 else g.op("Mul", y, g.f32(scale)))

    x = norm(g, rd, f"{p}.input_layernorm.weight", h, cfg.hidden_size, cfg.rms_norm_eps)
    h = residual(h, attention(g, rd, cfg, i, x, io))
    x = norm(g, rd, f"{p}.post_attention_layernorm.weight", h, cfg.hidden_size, cfg.rms_norm_eps)
    if cfg.is_moe_layer(i):
        y = moe(g, rd, cfg, i, x, moe_forms)
        if cfg.block["post_moe_norm"]:  # A.X-K1: the released files keep it at the layer, transformers in mlp
            name = next((n for n in (f"{p}.post_mlp_layernorm.weight", f"{p}.mlp.post_mlp_layernorm.weight")
                         if rd.has(n)), f"{p}.post_mlp_layernorm.weight")
            y = norm(g, rd, name, y, cfg.hidden_size, cfg.rms_norm_eps)
    else:
        y = dense_mlp(g, rd, f"{p}.mlp", x, cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
    return residual(h, y)


# The decoder layer's builder by `cfg.block["layout"]` and how many cache layers one layer holds.
LAYOUTS = {"standard": (decoder_layer, 1), "longcat_flash": (longcat_layer, LONGCAT_SUBLAYERS)}
