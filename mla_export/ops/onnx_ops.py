"""The `mla_export` ONNX domain: op schemas, node helpers, and portable function bodies.

Custom-op graphs (`model.onnx`) hold `mla_export::MlaCacheWrite` and
`mla_export::MlaPagedAttention` nodes; OpenVINO runs them with the extension's ONNX frontend
mapping (docs/ARCHITECTURE.md has their contract). The ops' signatures are not spelled here: the
schemas and node inputs come from the op table (mla_export/ops/table.json, which the native
libraries compile too). `register_schemas()` makes the ONNX checker and shape inference know them.

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

from .. import ops

__all__ = [
    "DOMAIN", "PORTABLE_DOMAIN", "OPSET_VERSION", "ONNX_OPSET", "register_schemas",
    "cache_write_node", "paged_attention_node", "indexer_topk_node", "cache_update_node", "portable_attention_node",
    "portable_functions", "opset_imports", "step_check_node", "STEP_INPUTS", "CHECKED", "node",
]

DOMAIN = ops.table()["domain"]
PORTABLE_DOMAIN = "mla_export.portable"
OPSET_VERSION = ops.table()["opset"]
ONNX_OPSET = 21  # ScatterND reduction, ReduceMean/ReduceSum axes as inputs, UINT4 initializers (int4 weights); read by ORT and OpenVINO

_ONNX_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)",
               "int32": "tensor(int32)", "int64": "tensor(int64)", "int8": "tensor(int8)", "uint8": "tensor(uint8)",
               "bool": "tensor(bool)"}


def opset_imports(portable: bool = False) -> list:
    ops = [helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    if portable:
        ops.append(helper.make_opsetid(PORTABLE_DOMAIN, OPSET_VERSION))
    return ops


# ------------------------------------------------------------------------------------ schemas
_ATTR_TYPES = {"float": "FLOAT", "int": "INT", "string": "STRING"}


def _schema(spec: dict, classes: dict):
    """One op's ONNX schema from the op table: a type constraint per type class its inputs use
    (inputs of one class share it, as the kernels expect), the output type by its rule."""
    S = onnx.defs.OpSchema
    P = S.FormalParameter

    def constraint(cls: str) -> str:
        return f"T_{cls}"

    inputs = []
    for i in spec["inputs"]:
        opt = (S.FormalParameterOption.Variadic if i.get("variadic") else
               S.FormalParameterOption.Optional if i.get("optional") else S.FormalParameterOption.Single)
        inputs.append(P(i["name"], constraint(i["type"]), i.get("doc", ""), param_option=opt,
                        is_homogeneous=bool(i.get("variadic"))))
    by_name = {i["name"]: i for i in spec["inputs"]}
    outputs = []
    for o in spec["outputs"]:
        t = o["type"]
        typ = constraint(by_name[t[1:]]["type"]) if t.startswith("=") else _ONNX_TYPES[classes[t][0]]
        outputs.append(P(o["name"], typ, o.get("doc", "")))
    used = sorted({i["type"] for i in spec["inputs"]})
    constraints = [(constraint(c), [_ONNX_TYPES[t] for t in classes[c]], "") for c in used]
    attributes = []
    for a in spec["attributes"]:
        if "default" in a:
            attributes.append(S.Attribute(a["name"], helper.make_attribute(a["name"], a["default"]), a.get("doc", "")))
        else:
            attributes.append(S.Attribute(a["name"], getattr(S.AttrType, _ATTR_TYPES[a["type"]]), a.get("doc", ""),
                                          required=True))
    return S(spec["name"], DOMAIN, OPSET_VERSION, spec.get("doc", ""), inputs=inputs, outputs=outputs,
             type_constraints=constraints, attributes=attributes)


def _schemas():
    t = ops.table()
    return [_schema(spec, t["types"]) for spec in t["ops"]]


def register_schemas() -> None:
    """Register the domain's schemas with onnx (once per process)."""
    for schema in _schemas():
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)


# ------------------------------------------------------------------------------ node helpers
def node(op_type: str, inputs: dict, outputs: list, name: str, **attrs):
    """A node of the mla_export domain: inputs by name, put in the op's order by the table (a list
    for the variadic input); attributes checked against the table, None ones left out."""
    ordered = ops.ordered_inputs(op_type, inputs)
    names = []
    for _, value in ordered:
        names.extend(value if isinstance(value, (list, tuple)) else [value])
    return helper.make_node(op_type, names, list(outputs), name=name, domain=DOMAIN,
                            **ops.attributes(op_type, attrs))


def cache_write_node(kv_c: str, k_pe: str, kv_cache: str, slot_mapping: str, out: str, name: str,
                     kv_dtype: str = ""):
    return node("MlaCacheWrite", dict(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping), [out], name,
                kv_dtype=kv_dtype or None)


def paged_attention_node(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables, after,
                         out: str, name: str, scale: float, form: int = 0, kv_dtype: str = "",
                         topk_indices: str | None = None):
    return node("MlaPagedAttention", dict(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, w_uk=w_uk, w_uv=w_uv,
                                          query_start_loc=query_start_loc, seq_lens=seq_lens,
                                          block_tables=block_tables, after=after, topk_indices=topk_indices or None),
                [out], name, scale=scale, form=form, kv_dtype=kv_dtype or None)


def indexer_topk_node(q, weights, index_cache, query_start_loc, seq_lens, block_tables, after, out: str, name: str,
                      topk: int, kv_dtype: str = ""):
    return node("MlaIndexerTopK", dict(q=q, weights=weights, index_cache=index_cache, query_start_loc=query_start_loc,
                                       seq_lens=seq_lens, block_tables=block_tables, after=after),
                [out], name, topk=topk, kv_dtype=kv_dtype or None)


# The step's metadata inputs (MlaStepCheck's inputs before the caches) and the names the graph
# reads instead of the ones the check passes through (its outputs take those inputs' types).
STEP_INPUTS = tuple(i["name"] for i in ops.op("MlaStepCheck")["inputs"] if not i.get("variadic"))
CHECKED = {o["type"][1:]: f"{o['type'][1:]}.checked" for o in ops.op("MlaStepCheck")["outputs"]}


def step_check_node(num_layers: int, vocab_size: int, max_positions: int, name: str = "step_check",
                    caches: list[str] | None = None):
    """The graph's first node: validates the whole step; the rest of the graph reads input_ids,
    positions and slot_mapping only through its outputs (CHECKED), so no cache write can run
    before the step was accepted. caches: the cache inputs (default kv_cache.0 .. num_layers - 1;
    the MTP draft graph's one is kv_cache.<its layer index>)."""
    caches = caches or [f"kv_cache.{i}" for i in range(num_layers)]
    return node("MlaStepCheck", {**{n: n for n in STEP_INPUTS}, "kv_cache": caches}, list(CHECKED.values()), name,
                vocab_size=int(vocab_size), max_positions=int(max_positions))


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
