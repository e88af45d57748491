"""The graph contract: what the exporter writes validates, and every kind of breakage is caught
with a message that names it (file missing, version, schema, I/O lists, graph I/O vs contract)."""

from __future__ import annotations

import json

import pytest

from mla_export.formats.contract import CONTRACT_FILE, graph_io, load_contract, schema
from mla_export.formats.contract_error import ContractError
from mla_export.export import export_model
from mla_export.checkpoint.presets import make_checkpoint


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("contract")
    ckpt = make_checkpoint(base / "ckpt", "deepseek_v2", seed=5, q_lora_rank=None)
    out = base / "out"
    export_model(ckpt, out, fmt="both", portable=True, block_size=8, kv_dtype="bf16", weight_dtype="f32")
    return out


def _broken(export_dir, tmp_path, edit):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(export_dir, out)
    raw = json.loads((out / CONTRACT_FILE).read_text())
    edit(raw)
    (out / CONTRACT_FILE).write_text(json.dumps(raw))
    return out


def test_written_contract_loads(export_dir):
    c = load_contract(export_dir)
    assert c.version == 1 and c.model["model_type"] == "deepseek_v2" and c.model["q_lora_rank"] is None
    names = [t.name for t in c.inputs()]
    assert names[:7] == ["input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
                         "logits_indices"]
    assert names[7:] == [f"kv_cache.{i}" for i in range(c.model["num_layers"])]
    cache = c.inputs()[7]
    assert (cache.dtype, cache.shape) == ("u8", ("NB", 8, 2 * c.cache["row_width"]))
    portable_cache = c.inputs("portable")[7]
    assert (portable_cache.dtype, portable_cache.shape) == ("bf16", ("NB", 8, c.cache["row_width"]))
    assert [t.name for t in c.outputs("portable")][1:] == [f"kv_cache_out.{i}" for i in range(c.model["num_layers"])]
    assert all(t.meaning for t in c.inputs() + c.outputs())


def _onnx_io(path):
    import onnx
    from onnx import TensorProto

    names = {TensorProto.FLOAT: "f32", TensorProto.BFLOAT16: "bf16", TensorProto.INT32: "i32",
             TensorProto.UINT8: "u8"}
    g = onnx.load(str(path), load_external_data=False).graph

    def triples(vis):
        return [(v.name, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim],
                 names[v.type.tensor_type.elem_type]) for v in vis]

    return triples(g.input), triples(g.output)


def test_graphs_match_their_contract(export_dir):
    from mla_export import ov_core

    c = load_contract(export_dir)
    c.validate_openvino_model(ov_core().read_model(str(c.graph_path("openvino_xml"))))
    c.validate_openvino_model(ov_core().read_model(str(c.graph_path("onnx"))))
    c.validate_model_io(*_onnx_io(c.graph_path("onnx")))
    c.validate_model_io(*_onnx_io(c.graph_path("onnx_portable")), variant="portable")
    with pytest.raises(ContractError, match="element type u8, contract says bf16"):
        c.validate_model_io(*_onnx_io(c.graph_path("onnx")), variant="portable")


def test_validate_model_io_mismatches(export_dir):
    c = load_contract(export_dir)
    good_in = [(t.name, [d if isinstance(d, int) else None for d in t.shape], t.dtype) for t in c.inputs()]
    good_out = [("logits", [None, c.model["vocab_size"]], "f32")]
    c.validate_model_io(good_in, good_out)
    cases = [
        (good_in[:-1], good_out, "lacks the input 'kv_cache.2'"),
        (good_in + [("extra", [1], "f32")], good_out, "does not know: extra"),
        ([(n, s, "i64" if n == "seq_lens" else d) for n, s, d in good_in], good_out, "'seq_lens': element type i64"),
        ([(n, [None, 16, s[2]] if n.startswith("kv_cache") else s, d) for n, s, d in good_in], good_out,
         "dim 1 is 16, contract says 8"),
        ([(n, s[:1] if n == "block_tables" else s, d) for n, s, d in good_in], good_out, "rank 1"),
        (good_in, [], "lacks the output 'logits'"),
    ]
    for inputs, outputs, message in cases:
        with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)")):
            c.validate_model_io(inputs, outputs)


@pytest.mark.parametrize("edit,message", [
    (lambda r: r.update(version=2), "contract version 2"),
    (lambda r: r.pop("cache"), "missing key 'cache'"),
    (lambda r: r.update(surprise=1), "unknown key 'surprise'"),
    (lambda r: r["cache"].update(dtype="int4"), "cache.dtype: must be one of"),
    (lambda r: r["cache"].update(dtype="f16"), "cache.row_layout 'bf16"),  # the file's layout is bf16's
    (lambda r: (r["cache"].update(dtype="int8"), r["cache"].pop("row_layout")), "a int8 cache is declared u8"),
    (lambda r: r["cache"].update(row_width=50), "row_width 50"),
    (lambda r: r["cache"].update(graph_dtype="f32"), "declared u8"),
    (lambda r: r["model"].update(num_layers="3"), "model.num_layers: expected integer"),
    (lambda r: r["inputs"].pop(8), "custom inputs differ"),
    (lambda r: r["inputs"][0].update(dtype="i64"), "item 0"),
    (lambda r: r["portable"]["outputs"].pop(), "portable outputs differ"),
    (lambda r: r["files"].update(onnx="elsewhere.onnx"), "missing: elsewhere.onnx"),
    (lambda r: r.update(portable=None), "'portable' I/O must be given exactly when"),
])
def test_broken_contracts_are_rejected(export_dir, tmp_path, edit, message):
    out = _broken(export_dir, tmp_path, edit)
    with pytest.raises(ContractError, match=message.replace("(", r"\(")):
        load_contract(out)


def test_missing_or_unreadable(tmp_path):
    with pytest.raises(ContractError, match="not found"):
        load_contract(tmp_path)
    (tmp_path / CONTRACT_FILE).write_text("{not json")
    with pytest.raises(ContractError, match="not readable as JSON"):
        load_contract(tmp_path)


def test_schema_and_graph_io_agree():
    s = schema()
    assert s["properties"]["version"]["const"] == 1
    inputs, outputs = graph_io(2, 16, 576, "f32")
    dtypes = set(s["$defs"]["tensor"]["properties"]["dtype"]["enum"])
    assert {t.dtype for t in inputs + outputs} <= dtypes
    assert len(inputs) >= s["properties"]["inputs"]["minItems"]
    with pytest.raises(ContractError):
        graph_io(2, 16, 576, "int4")
    with pytest.raises(ContractError, match="kv_lora_rank"):
        graph_io(2, 16, 576, "int8")  # r is needed to size an int8 row
    with pytest.raises(ContractError, match="portable ONNX graph cannot hold an fp8 cache"):
        graph_io(2, 16, 576, "fp8", "portable", 512)
    # int8 rows: 512 codes + 4 f32 group scales + 64 bf16 = 656 bytes; fp8: one scale, 644;
    # f16 as bf16: 2 * 576
    for kv, width in (("int8", 656), ("fp8", 644), ("e5m2", 644), ("f16", 1152), ("bf16", 1152)):
        cache = graph_io(2, 16, 576, kv, "custom", 512)[0][-1]
        assert (cache.dtype, cache.shape) == ("u8", ("NB", 16, width))
    assert graph_io(2, 16, 576, "f16", "portable")[0][-1].dtype == "f16"


def test_quantised_row_sizes_agree_with_kv_formats():
    # The contract derives its row sizes from the registry (mla_export/formats/kv_formats.py); they must
    # be the codec's, and the registry's scale-group rule must be enforced.
    from mla_export.formats import kv_formats
    from mla_export.formats.contract import cache_layout
    for kv in kv_formats.QUANTISED:
        for r, dr in ((512, 64), (32, 16), (20, 6)):
            assert cache_layout(kv, r + dr, r)[1] == kv_formats.row_bytes(kv, r, dr), (kv, r, dr)
    with pytest.raises(ContractError, match="multiple of 4"):
        cache_layout("int8", 30 + 8, 30)


class TestSchemaNamesTheRegistry:
    """graphs/mla_graph.schema.json spells the cache formats for JSON Schema readers: exactly the
    registry's, so a format added to kv_formats.FORMATS and not to the schema fails here."""

    def test_cache_dtype_enum_is_the_registry(self):
        from mla_export.formats import kv_formats
        from mla_export.formats.contract import schema
        enum = schema()["properties"]["cache"]["properties"]["dtype"]["enum"]
        assert sorted(enum) == sorted(kv_formats.KV_DTYPES)


def test_exports_with_the_older_logits_dim_name_load(export_dir, tmp_path):
    """Exports written when logits_indices had one row per sequence name its dim (and the logits'
    rows) "B"; the graphs are the same, so they load as they are."""
    def old(raw):
        for io in ("inputs", "outputs"):
            for t in raw[io] + (raw["portable"][io] if raw["portable"] else []):
                if t["name"] in ("logits_indices", "logits"):
                    t["shape"] = ["B"] + list(t["shape"][1:])

    c = load_contract(_broken(export_dir, tmp_path, old))
    assert c.version == 1
