"""The `mla_export` ONNX domain: op schemas, node helpers, and portable function bodies.

Custom-op graphs (`model.onnx`) hold `mla_export::MlaCacheWrite` and
`mla_export::MlaPagedAttention` nodes; OpenVINO runs them with the extension's ONNX frontend
mapping (docs/ARCHITECTURE.md has their contract). `register_schemas()` makes the ONNX checker
and shape inference know them.

Portable graphs (`model_portable.onnx`) run in plain onnxruntime. Their MLA nodes call
model-local ONNX functions built here from standard ops, in their own domain
`mla_export.portable`: a function cannot write into its input, so the cache update returns the
new cache (`MlaCacheUpdate`, a different signature than `MlaCacheWrite`), and a distinct domain
keeps a registered custom-op library (which wins over a function of the same name) from ever
replacing a functional node by an in-place one.

The portable attention is the absorbed form, computed for all packed tokens at once against the
context rows of every sequence of the batch ([T, H, B*L] scores, L = block table width x block
size) with a mask that keeps key l of sequence b for token t iff b is t's sequence and l <= t's
position. Simple and f32-exact, not fast: it is the portability path, not the serving path.
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto, helper

from .kv_formats import KV_DTYPES

__all__ = [
    "DOMAIN", "PORTABLE_DOMAIN", "OPSET_VERSION", "ONNX_OPSET", "register_schemas",
    "cache_write_node", "paged_attention_node", "indexer_topk_node", "cache_update_node", "portable_attention_node",
    "portable_functions", "opset_imports", "step_check_node", "STEP_INPUTS", "CHECKED",
]

DOMAIN = "mla_export"
PORTABLE_DOMAIN = "mla_export.portable"
OPSET_VERSION = 1
ONNX_OPSET = 21  # ScatterND reduction, ReduceMean/ReduceSum axes as inputs, UINT4 initializers (int4 weights); read by ORT and OpenVINO

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
_CACHES = ["tensor(float)", "tensor(bfloat16)", "tensor(float16)", "tensor(uint8)"]  # u8: rows as bytes
_INDICES = ["tensor(int32)", "tensor(int64)"]
_ANY = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(int32)", "tensor(int64)",
        "tensor(int8)", "tensor(uint8)", "tensor(bool)"]


def opset_imports(portable: bool = False) -> list:
    ops = [helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    if portable:
        ops.append(helper.make_opsetid(PORTABLE_DOMAIN, OPSET_VERSION))
    return ops


# ------------------------------------------------------------------------------------ schemas
def _schemas():
    P, S = onnx.defs.OpSchema.FormalParameter, onnx.defs.OpSchema
    opt = S.FormalParameterOption.Optional
    A = S.Attribute
    kv_dtype = A("kv_dtype", helper.make_attribute("kv_dtype", ""),
                 f"cache row format: {', '.join(KV_DTYPES)} (mla_export/kv_formats.py); empty = by the cache's "
                 "element type, u8 = bf16 rows")
    # What the two reading ops share: their type constraints, the softmax scale and the ordering input.
    reader_types = [("T", _FLOATS, ""), ("C", _CACHES, ""), ("I", _INDICES, ""), ("X", _ANY, "")]
    scale = A("scale", S.AttrType.FLOAT, "softmax scale", required=True)
    after = P("after", "X", "ordering only, never read", param_option=opt)
    cache_write = S(
        "MlaCacheWrite", DOMAIN, OPSET_VERSION,
        "Writes row [kv_c | k_pe] (in the cache's dtype) at each slot >= 0 of kv_cache [NB, BS, W], in place; "
        "returns the number of rows written. Feed the result to the attention's last input to order the write first.",
        inputs=[P("kv_c", "T", "[T, r]"), P("k_pe", "T", "[T, dr]"), P("kv_cache", "C", "[NB, BS, r + dr]"),
                P("slot_mapping", "I", "[T] block_id * BS + offset, < 0 = skip")],
        outputs=[P("written", "tensor(int32)", "[1]")],
        type_constraints=[("T", _FLOATS, "activations"), ("C", _CACHES, "cache"), ("I", _INDICES, "indices")],
        attributes=[kv_dtype])
    def reader(name: str, doc: str, inputs: list, out_shape: str, attribute, extra: list = ()):
        """A reading op: its inputs then `after` (then `extra` optional inputs), output `out`, the
        shared types and attributes."""
        return S(name, DOMAIN, OPSET_VERSION, doc, inputs=inputs + [after, *extra], outputs=[P("out", "T", out_shape)],
                 type_constraints=reader_types, attributes=[scale, attribute, kv_dtype])

    decode = reader(
        "MlaPagedDecode", "Absorbed MQA decode over the paged latent cache (vLLM mla_decode_kvcache semantics).",
        [P("q", "T", "[B, H, W]"), P("kv_cache", "C", "[NB, BS, W]"), P("block_tables", "I", "[B, M]"),
         P("seq_lens", "I", "[B]")],
        "[B, H, r]", A("kv_lora_rank", S.AttrType.INT, "r, the model's kv_lora_rank", required=True))
    attention = reader(
        "MlaPagedAttention",
        "Causal paged MLA over packed new tokens: token j of sequence b sits at position "
        "seq_lens[b] - qlen_b + j and attends to positions 0..itself.",
        [P("q_nope", "T", "[T, H, dn]"), P("q_pe", "T", "[T, H, dr]"), P("kv_cache", "C", "[NB, BS, W]"),
         P("w_uk", "T", "[H, dn, r]"), P("w_uv", "T", "[H, r, dv]"), P("query_start_loc", "I", "[B+1]"),
         P("seq_lens", "I", "[B]"), P("block_tables", "I", "[B, M]")],
        "[T, H, dv]", A("form", helper.make_attribute("form", 0), "0 auto, 1 absorbed, 2 expanded"),
        [P("topk_indices", "I", "[T, K] sparse attention: the positions each token attends to (-1 = none)",
           param_option=opt)])
    indexer = S(
        "MlaIndexerTopK", DOMAIN, OPSET_VERSION,
        "DeepSeek Sparse Attention's lightning indexer over the paged key cache: per new token the topk "
        "positions it sees of largest sum_h weights[t, h] * relu(q[t, h] . key[s]), ascending, -1 padded.",
        inputs=[P("q", "T", "[T, Hi, D]"), P("weights", "T", "[T, Hi]"), P("index_cache", "C", "[NB, BS, D]"),
                P("query_start_loc", "I", "[B+1]"), P("seq_lens", "I", "[B]"), P("block_tables", "I", "[B, M]"),
                after],
        outputs=[P("topk_indices", "tensor(int32)", "[T, topk]")],
        type_constraints=reader_types,
        attributes=[A("topk", S.AttrType.INT, "positions per token (the model's index_topk)", required=True),
                    kv_dtype])
    var = S.FormalParameterOption.Variadic
    step_check = S(
        "MlaStepCheck", DOMAIN, OPSET_VERSION,
        "Checks a whole step's metadata against the caches and the model's vocab and positions before any "
        "layer runs; outputs input_ids, positions and slot_mapping unchanged, so everything after depends on it.",
        inputs=[P("input_ids", "I", "[T]"), P("positions", "I", "[T]"), P("slot_mapping", "I", "[T]"),
                P("query_start_loc", "I", "[B+1]"), P("seq_lens", "I", "[B]"), P("block_tables", "I", "[B, M]"),
                P("logits_indices", "I", "[L]"),
                P("kv_cache", "C", "one per layer, [NB, BS, W] (u8: [NB, BS, 2W] bf16 bytes)", param_option=var,
                  is_homogeneous=True)],
        outputs=[P("input_ids_checked", "I", "[T]"), P("positions_checked", "I", "[T]"),
                 P("slot_mapping_checked", "I", "[T]")],
        type_constraints=[("I", _INDICES, ""), ("C", _CACHES + ["tensor(int8)"], "")],
        attributes=[A("vocab_size", S.AttrType.INT, "token ids lie in [0, vocab_size)", required=True),
                    A("max_positions", S.AttrType.INT, "rows of the RoPE table", required=True)])
    return [cache_write, decode, attention, indexer, step_check]


def register_schemas() -> None:
    """Register the domain's schemas with onnx (once per process)."""
    for schema in _schemas():
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)


# ------------------------------------------------------------------------------ node helpers
def cache_write_node(kv_c: str, k_pe: str, kv_cache: str, slot_mapping: str, out: str, name: str,
                     kv_dtype: str = ""):
    return helper.make_node("MlaCacheWrite", [kv_c, k_pe, kv_cache, slot_mapping], [out], name=name, domain=DOMAIN,
                            **({"kv_dtype": kv_dtype} if kv_dtype else {}))


def paged_attention_node(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables, after,
                         out: str, name: str, scale: float, form: int = 0, kv_dtype: str = "",
                         topk_indices: str | None = None):
    if not isinstance(form, int) or form not in (0, 1, 2):  # OpenVINO would truncate a float silently
        raise ValueError(f"form must be 0, 1 or 2, got {form!r}")
    inputs = [q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables, after]
    if topk_indices:
        inputs.append(topk_indices)
    return helper.make_node("MlaPagedAttention", inputs, [out], name=name, domain=DOMAIN,
                            scale=float(scale), form=form, **({"kv_dtype": kv_dtype} if kv_dtype else {}))


def indexer_topk_node(q, weights, index_cache, query_start_loc, seq_lens, block_tables, after, out: str, name: str,
                      topk: int, kv_dtype: str = ""):
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive integer, got {topk!r}")
    return helper.make_node("MlaIndexerTopK", [q, weights, index_cache, query_start_loc, seq_lens, block_tables, after],
                            [out], name=name, domain=DOMAIN, topk=topk, **({"kv_dtype": kv_dtype} if kv_dtype else {}))


STEP_INPUTS = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
               "logits_indices")
CHECKED = {name: f"{name}.checked" for name in STEP_INPUTS[:3]}  # what the graph reads instead


def step_check_node(num_layers: int, vocab_size: int, max_positions: int, name: str = "step_check",
                    caches: list[str] | None = None):
    """The graph's first node: validates the whole step; the rest of the graph reads input_ids,
    positions and slot_mapping only through its outputs (CHECKED), so no cache write can run
    before the step was accepted. caches: the cache inputs (default kv_cache.0 .. num_layers - 1;
    the MTP draft graph's one is kv_cache.<its layer index>)."""
    caches = caches or [f"kv_cache.{i}" for i in range(num_layers)]
    return helper.make_node("MlaStepCheck", [*STEP_INPUTS, *caches], list(CHECKED.values()), name=name,
                            domain=DOMAIN, vocab_size=int(vocab_size), max_positions=int(max_positions))


def cache_update_node(kv_c: str, k_pe: str, kv_cache: str, slot_mapping: str, out: str, name: str):
    return helper.make_node("MlaCacheUpdate", [kv_c, k_pe, kv_cache, slot_mapping], [out], name=name,
                            domain=PORTABLE_DOMAIN)


def portable_attention_node(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables,
                            out: str, name: str, scale: float):
    return helper.make_node("MlaPagedAttention", [q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens,
                                                  block_tables], [out], name=name, domain=PORTABLE_DOMAIN,
                            scale=float(scale))


# ------------------------------------------------------------------------- function bodies
class _Body:
    """A tiny node list builder for function bodies (names are local to the function)."""

    def __init__(self):
        self.nodes = []
        self._n = 0

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        self._n += 1
        out = f"{op.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def ints(self, *values: int) -> str:
        return self("Constant", value=helper.make_tensor("v", TensorProto.INT64, [len(values)], list(values)))

    def int_scalar(self, value: int) -> str:
        return self("Constant", value=helper.make_tensor("v", TensorProto.INT64, [], [value]))

    def float_scalar(self, value: float) -> str:
        return self("Constant", value=helper.make_tensor("v", TensorProto.FLOAT, [], [value]))

    def dim(self, tensor: str, axis: int) -> str:
        """Shape(tensor)[axis] as an int64 [1] tensor."""
        return self("Shape", tensor, start=axis, end=axis + 1)


def _cache_update_function():
    b = _Body()
    rows = b("Concat", "kv_c", "k_pe", axis=1)  # [T, W]
    shape = b("Shape", "kv_cache")
    flat = b("Reshape", "kv_cache", b("Concat", b.ints(-1), b.dim("kv_cache", 2), axis=0))  # [NB*BS, W]
    slots = b("Cast", "slot_mapping", to=TensorProto.INT64)
    keep = b("GreaterOrEqual", slots, b.int_scalar(0))  # padding slots (< 0) leave their row untouched
    kept_slots = b("Unsqueeze", b("Compress", slots, keep, axis=0), b.ints(1))
    kept_rows = b("CastLike", b("Compress", rows, keep, axis=0), "kv_cache")  # (Compress-11 has no bf16)
    updated = b("ScatterND", flat, kept_slots, kept_rows)
    b.nodes.append(helper.make_node("Reshape", [updated, shape], ["kv_cache_out"]))
    return helper.make_function(PORTABLE_DOMAIN, "MlaCacheUpdate", ["kv_c", "k_pe", "kv_cache", "slot_mapping"],
                                ["kv_cache_out"], b.nodes, [helper.make_opsetid("", ONNX_OPSET)])


def _paged_attention_function():
    b = _Body()
    i64 = TensorProto.INT64
    scale_node = helper.make_node("Constant", [], ["scale"])
    scale_ref = helper.make_attribute_ref("value_float", AttributeProto.FLOAT)
    scale_ref.ref_attr_name = "scale"  # set on the proto: onnx < 1.18's helper has no such keyword
    scale_node.attribute.append(scale_ref)
    b.nodes.append(scale_node)  # the function's `scale` attribute as a tensor
    scale = "scale"
    q_nope, q_pe = "q_nope", "q_pe"
    zero, one = b.int_scalar(0), b.int_scalar(1)
    # Context rows of every sequence: slot of key l of sequence b = block_tables[b, l // BS] * BS + l % BS.
    bs = b.dim("kv_cache", 1)
    tables = b("Cast", "block_tables", to=i64)
    offsets = b("Reshape", b("Range", zero, b("Squeeze", bs, b.ints(0)), one), b.ints(1, 1, -1))
    slots = b("Reshape", b("Add", b("Mul", b("Unsqueeze", tables, b.ints(2)), bs), offsets), b.ints(0, -1))  # [B, L]
    n_ctx = b("Squeeze", b.dim(slots, 1), b.ints(0))
    key_pos = b("Range", zero, n_ctx, one)  # [L]
    seq_lens = b("Cast", "seq_lens", to=i64)
    valid = b("Less", b("Unsqueeze", key_pos, b.ints(0)), b("Unsqueeze", seq_lens, b.ints(1)))  # [B, L]
    # Block table padding may hold any id: read slot 0 there; the row is zeroed and masked below.
    safe_slots = b("Reshape", b("Where", valid, slots, zero), b.ints(-1))
    flat = b("Reshape", "kv_cache", b("Concat", b.ints(-1), b.dim("kv_cache", 2), axis=0))
    ctx = b("Gather", b("CastLike", flat, q_nope), safe_slots, axis=0)  # [B*L, W]
    # Zero the rows past each sequence's end: 0 * NaN in probs @ rows would poison the output.
    ctx = b("Where", b("Unsqueeze", b("Reshape", valid, b.ints(-1)), b.ints(1)), ctx,
            b("CastLike", b.float_scalar(0.0), q_nope))
    # Absorbed queries: q576 = [q_nope @ w_uk | q_pe].
    q_lat = b("Transpose", b("MatMul", b("Transpose", q_nope, perm=[1, 0, 2]), b("CastLike", "w_uk", q_nope)),
              perm=[1, 0, 2])  # [T, H, r]
    q576 = b("Concat", q_lat, q_pe, axis=2)
    scores = b("Mul", b("MatMul", q576, b("Transpose", ctx, perm=[1, 0])), b("CastLike", scale, q_nope))
    # Causal mask over the packed tokens: token t of sequence s(t) at position pos(t) sees key (s, l)
    # iff s == s(t) and l <= pos(t).
    qsl = b("Cast", "query_start_loc", to=i64)
    starts = b("Slice", qsl, b.ints(0), b.ints(-1))
    ends = b("Slice", qsl, b.ints(1), b.ints(2**62))
    n_tok = b("Squeeze", b.dim(q_nope, 0), b.ints(0))
    t = b("Range", zero, n_tok, one)  # [T]
    seq_of_t = b("ReduceSum", b("Cast", b("GreaterOrEqual", b("Unsqueeze", t, b.ints(1)), b("Unsqueeze", ends, b.ints(0))),
                                to=i64), b.ints(1), keepdims=0)  # [T]
    first_pos = b("Sub", seq_lens, b("Sub", ends, starts))  # position of each sequence's first new token
    pos_t = b("Add", b("Gather", first_pos, seq_of_t, axis=0), b("Sub", t, b("Gather", starts, seq_of_t, axis=0)))
    n_seq = b("Squeeze", b.dim(seq_lens, 0), b.ints(0))
    grid = b("Concat", b.dim(seq_lens, 0), b.dim(slots, 1), axis=0)  # [B, L]
    key_seq = b("Reshape", b("Expand", b("Unsqueeze", b("Range", zero, n_seq, one), b.ints(1)), grid), b.ints(-1))
    key_at = b("Reshape", b("Expand", b("Unsqueeze", key_pos, b.ints(0)), grid), b.ints(-1))  # [B*L]
    allowed = b("And", b("Equal", b("Unsqueeze", seq_of_t, b.ints(1)), b("Unsqueeze", key_seq, b.ints(0))),
                b("LessOrEqual", b("Unsqueeze", key_at, b.ints(0)), b("Unsqueeze", pos_t, b.ints(1))))  # [T, B*L]
    neg_inf = b("CastLike", b.float_scalar(float("-inf")), q_nope)
    scores = b("Where", b("Unsqueeze", allowed, b.ints(1)), scores, neg_inf)  # [T, H, B*L]
    probs = b("Softmax", scores, axis=-1)
    values = b("Slice", ctx, b.ints(0), b.dim("w_uv", 1), b.ints(1))  # [B*L, r]
    o_lat = b("MatMul", probs, values)  # [T, H, r]
    o = b("MatMul", b("Transpose", o_lat, perm=[1, 0, 2]), b("CastLike", "w_uv", q_nope))  # [H, T, dv]
    b.nodes.append(helper.make_node("Transpose", [o], ["out"], perm=[1, 0, 2]))
    return helper.make_function(
        PORTABLE_DOMAIN, "MlaPagedAttention",
        ["q_nope", "q_pe", "kv_cache", "w_uk", "w_uv", "query_start_loc", "seq_lens", "block_tables"], ["out"],
        b.nodes, [helper.make_opsetid("", ONNX_OPSET)], attributes=["scale"])


def portable_functions() -> list:
    """The model-local functions a portable graph needs."""
    return [_cache_update_function(), _paged_attention_function()]
