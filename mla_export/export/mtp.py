"""The checkpoint's multi-token-prediction (MTP) module as a speculative-decoding draft graph.

DeepSeek-V3 checkpoints (and V3.2's, GLM-5's, Kimi K2's) carry one MTP layer after the last decoder
layer (config.json's num_nextn_predict_layers: 1; its weights model.layers.<num_hidden_layers>.*),
which transformers does not load. Its math is in mla_export/ops/reference_mtp.py (the float64
oracle): row t of a step is the MTP layer at position p = positions[t], fed the token after p
(input_ids[t]) and the main model's last hidden state at p (before the final norm, the main
graph's `hidden_states` output):

    x = eh_proj(concat(enorm(embed(t_{p+1})) [zeroed at position 0], hnorm(h_p)))
    h' = decoder layer (MLA attention over the draft's own latent cache, kv_cache.<N>; MoE)
    logits = shared_head.head(shared_head.norm(h'))  -> a guess of t_{p+2}

In the DeepSeek Sparse Attention families (V3.2, GLM-5) the decoder layer is theirs: the MTP layer
runs its own lightning indexer (model.layers.<N>.self_attn.indexer.*, in the released checkpoints
and in vLLM's DeepSeek MTP, which gives it its own key cache), whose keys go to the draft's own
index_cache.<N> at the same slots, and its attention reads the top-k rows it picks; a GLM-5 MTP
layer runs it whatever the main layers' indexer_types say (a shared layer would need the
selection of a layer of the main graph).

The graph takes the main graph's metadata (the same block tables and slots: the draft's cache
rows sit at the main cache's slots, in an array of their own) and returns the logits and h' of
the rows logits_indices picks; h' is the next draft step's hidden input. It is written to
mtp_draft.onnx (+ .onnx.data) and/or mtp_draft.xml/.bin, with its own weights file (the
embedding and head are copied into it: the draft runs as a separate compiled model).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ..ops import onnx_ops
from ..checkpoint.config import MLAModelConfig
from ..formats.contract import mtp_graph_io
from .graph import GraphBuilder, WeightFormat, WeightStore
from .layers import attention, dense_mlp, linear, norm
from .model import _embed, _inputs, _used, _value_info
from .moe import moe
from ..checkpoint.reader import CheckpointReader

__all__ = ["MTP_FILES", "mtp_layer", "build_mtp_onnx"]

MTP_FILES = {"onnx": "mtp_draft.onnx", "onnx_data": "mtp_draft.onnx.data", "openvino_xml": "mtp_draft.xml",
             "openvino_bin": "mtp_draft.bin", "openvino_source": "mtp_draft_openvino_source.onnx"}
# the families whose MTP layer this graph builds: V3's block, and V3.2's / GLM-5's (V3's with the indexer)
_MTP_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")


def mtp_layer(cfg: MLAModelConfig, reader: CheckpointReader) -> tuple[int | None, str | None]:
    """(the MTP layer's index or None, a note for the user or None): None, None when config.json
    declares no MTP layer; None and why when it declares one that is not exported; the index
    (and a note when more layers are declared: only the first is exported) otherwise."""
    declared = cfg.raw.get("num_nextn_predict_layers", cfg.raw.get("num_mtp_layers")) or 0
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 0:
        return None, f"num_nextn_predict_layers {declared!r} is not a count; no MTP draft exported"
    if declared == 0:
        return None, None
    n = cfg.num_layers
    if not reader.has(f"model.layers.{n}.eh_proj.weight"):
        return None, (f"config.json declares {declared} MTP layer(s) but the checkpoint holds no "
                      f"model.layers.{n}.eh_proj.weight: no MTP draft exported")
    if cfg.model_type not in _MTP_TYPES or cfg.block["layout"] != "standard":
        return None, (f"the MTP draft is built for DeepSeek-V3's, V3.2's and GLM-5's layers only, not "
                      f"{cfg.model_type}'s: not exported")
    if cfg.sparse and not reader.has(f"model.layers.{n}.self_attn.indexer.wk.weight"):
        return None, (f"the MTP layer of a sparse-attention model runs its own indexer, but the checkpoint holds no "
                      f"model.layers.{n}.self_attn.indexer.wk.weight: no MTP draft exported")
    if declared > 1:
        return n, (f"config.json declares {declared} MTP layers: the first (model.layers.{n}) is exported as the "
                   "draft, the others are not read")
    return n, None


def build_mtp_onnx(cfg: MLAModelConfig, reader: CheckpointReader, out_dir: Path, layer: int, *, variants: list[str],
                   block_size: int, kv_dtype: str, weight_format: WeightFormat,
                   moe_forms: dict[str, str] | None) -> dict[str, Path]:
    """The draft graph of MTP layer `layer`, one file per variant ("custom": mtp_draft.onnx, the
    onnxruntime graph; "openvino": the IR's own source where its MoE form differs), on one
    weights file mtp_draft.onnx.data. Returns variant -> path."""
    variants = [v for v in variants if v != "portable"]  # the draft runs on the custom ops only
    moe_forms = {v: form for v, form in moe_forms.items() if v in variants} if moe_forms else None
    store = WeightStore(Path(out_dir) / MTP_FILES["onnx_data"], weight_format)
    try:
        g = GraphBuilder(store, variants)
        _build_mtp(g, reader, cfg, layer, moe_forms, kv_dtype)
    finally:
        store.close()
    onnx_ops.register_schemas()
    inputs, outputs = mtp_graph_io(block_size, cfg.row_width, kv_dtype, cfg.kv_lora_rank, cfg.hidden_size, layer,
                                   cfg.sparse.index_head_dim if cfg.sparse else None)
    paths = {}
    for variant in variants:
        graph = helper.make_graph(g.variants[variant], f"{cfg.model_type}_mtp_{variant}",
                                  [_value_info(s, cfg.vocab_size) for s in inputs],
                                  [_value_info(s, cfg.vocab_size) for s in outputs],
                                  _used(store.initializers, g.variants[variant]))
        model = helper.make_model(graph, opset_imports=onnx_ops.opset_imports(False), producer_name="mla-export",
                                  ir_version=10)
        path = Path(out_dir) / MTP_FILES["onnx" if variant == "custom" else "openvino_source"]
        onnx.save_model(model, str(path))
        paths[variant] = path
    return paths


def _build_mtp(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, n: int,
               moe_forms: dict[str, str] | None, kv_dtype: str) -> None:
    p, hidden, eps = f"model.layers.{n}", cfg.hidden_size, cfg.rms_norm_eps
    io = _inputs(g, cfg, caches=[f"kv_cache.{n}"])
    io["kv_dtype"] = kv_dtype
    # The embedding is the model's (DeepSeek's files may keep a copy in the MTP layer: then that one).
    table = f"{p}.embed_tokens.weight" if rd.has(f"{p}.embed_tokens.weight") else "model.embed_tokens.weight"
    e, _ = _embed(g, rd, cfg, table)
    # Zeroed at position 0, as vLLM's DeepSeek MTP layer does: min(position, 1) is 0 there, else 1.
    first = g.op("Min", g.op("Cast", onnx_ops.CHECKED["positions"], to=TensorProto.FLOAT), g.f32(1.0))
    e = g.op("Mul", e, g.op("Unsqueeze", first, g.i64(1)))
    x = g.op("Concat", norm(g, rd, f"{p}.enorm.weight", e, hidden, eps),
             norm(g, rd, f"{p}.hnorm.weight", "hidden_states", hidden, eps), axis=-1)  # embedding half first
    h = linear(g, rd, f"{p}.eh_proj", x, hidden, 2 * hidden)
    # The decoder layer (V3's block: no residual scaling; a sparse model's attention runs the MTP
    # layer's own indexer on index_cache.<n>: layers.sparse_indexer); MoE when the layer has a router.
    a = norm(g, rd, f"{p}.input_layernorm.weight", h, hidden, eps)
    h = g.op("Add", h, attention(g, rd, cfg, n, a, io))
    a = norm(g, rd, f"{p}.post_attention_layernorm.weight", h, hidden, eps)
    if rd.has(f"{p}.mlp.gate.weight"):
        y = moe(g, rd, cfg, n, a, moe_forms)
    else:
        y = dense_mlp(g, rd, f"{p}.mlp", a, hidden, cfg.intermediate_size, cfg.mlp_bias)
    h = g.op("Add", h, y)
    picked = g.op("Gather", h, "logits_indices", axis=0)
    g.op("Identity", picked, name="mtp_hidden_states")
    picked = norm(g, rd, f"{p}.shared_head.norm.weight", picked, hidden, eps)
    head = f"{p}.shared_head.head.weight"
    if not rd.has(head):  # a checkpoint that shares the head with lm_head
        head = "lm_head.weight"
    g.op("Gemm", picked, g.weight(head, rd.get(head, (cfg.vocab_size, hidden)), kind="head"), transB=1,
         name="logits")
