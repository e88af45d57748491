"""The ops declared once (mla_export/ops/table.json): Python's view of every op equals what each
built library compiled in, each adapter registers exactly the table's ops, the adapters spell no
op, and a new attribute needs the table (and the kernel) only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from mla_export import extension_path, ops, ort_ops_path, ov_core
from mla_export.ops import onnx_ops

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = [ROOT / "custom_ops/openvino/mla_ops.hpp", ROOT / "custom_ops/openvino/mla_ops.cpp",
            ROOT / "custom_ops/openvino/extension.cpp", ROOT / "custom_ops/onnxruntime/mla_ort_ops.cpp"]


def libraries() -> list[str]:
    import openvino  # noqa: F401  (loads libopenvino, which the extension links to)
    return [extension_path()] + ([ort_ops_path()] if ort_ops_path() else [])


class TestPythonViewEqualsLibraries:
    """A library built from another table (stale build, edited header) is caught here."""

    @pytest.mark.parametrize("which", ["openvino", "onnxruntime"])
    def test_library_table_equals_table_json(self, which):
        paths = dict(zip(["openvino", "onnxruntime"], libraries()))
        if which not in paths:
            pytest.skip("libmla_export_ort.so not built")
        assert ops.library_table(paths[which]) == ops.comparable(ops.table())

    def test_schemas_are_the_table(self):
        onnx_ops.register_schemas()
        for spec in ops.table()["ops"]:
            schema = onnx.defs.get_schema(spec["name"], ops.table()["opset"], ops.table()["domain"])
            assert [i.name for i in schema.inputs] == ops.input_names(spec["name"])
            assert sorted(schema.attributes) == sorted(a["name"] for a in spec["attributes"])
            assert [o.name for o in schema.outputs] == [o["name"] for o in spec["outputs"]]


def _sample_attribute(a: dict):
    """A valid value of an attribute by the table alone (the kernels' own checks: a known value)."""
    if "default" in a:
        return a["default"]
    if "allowed" in a:
        return a["allowed"][0]
    if a.get("check") == "weight_bits":
        return 8
    return {"float": 0.5, "int": max(1, a.get("min", 1)), "string": ""}[a["type"]]


def _one_op_model(name: str) -> onnx.ModelProto:
    """name's node over graph inputs of its required inputs (first type of each class, dynamic
    dims; the variadic one once), every attribute set."""
    spec, types = ops.op(name), ops.table()["types"]
    inputs = [i for i in spec["inputs"] if not i.get("optional")]
    vi = [helper.make_tensor_value_info(i["name"], helper.np_dtype_to_tensor_dtype(np.dtype(types[i["type"]][0])),
                                        [f"{i['name']}_{k}" for k in range(i.get("rank") or 1)]) for i in inputs]
    def elem(o):  # the output's type by the table's rule, with the inputs' first types
        t = o["type"]
        cls = next(i["type"] for i in inputs if i["name"] == t[1:]) if t.startswith("=") else t
        return helper.np_dtype_to_tensor_dtype(np.dtype(types[cls][0]))

    outs = [o["name"] for o in spec["outputs"]]
    node = helper.make_node(name, [i["name"] for i in inputs], outs, domain=ops.table()["domain"],
                            **{a["name"]: _sample_attribute(a) for a in spec["attributes"]})
    graph = helper.make_graph([node], name, vi, [helper.make_tensor_value_info(o["name"], elem(o), None)
                                                 for o in spec["outputs"]])
    return helper.make_model(graph, opset_imports=onnx_ops.opset_imports(), ir_version=10)


class TestAdaptersRegisterTheTable:
    """Each adapter's op list is the table's: every op loads, a name outside it does not."""

    @pytest.mark.parametrize("name", ops.names())
    def test_openvino_onnx_and_ir(self, name, tmp_path):
        import openvino as ov

        model = ov_core().read_model(_one_op_model(name).SerializeToString())  # the ONNX conversion
        assert [op.get_type_name() for op in model.get_ops() if op.get_type_name().startswith("Mla")] == [name]
        ov.save_model(model, tmp_path / "m.xml", compress_to_fp16=False)
        reread = ov_core().read_model(tmp_path / "m.xml")  # the op class (IR)
        assert [op.get_type_name() for op in reread.get_ops() if op.get_type_name().startswith("Mla")] == [name]

    @pytest.mark.parametrize("name", ops.names())
    def test_onnxruntime(self, name):
        ort = pytest.importorskip("onnxruntime")
        from mla_export.ops import kernels_onnxruntime as ok
        if not ok.available():
            pytest.skip("libmla_export_ort.so not built")
        ort.InferenceSession(_one_op_model(name).SerializeToString(), sess_options=ok.session_options(),
                             providers=["CPUExecutionProvider"])

    def test_names_outside_the_table_are_refused(self, tmp_path):
        ort = pytest.importorskip("onnxruntime")
        from mla_export.ops import kernels_onnxruntime as ok
        f, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
        old = {"MlaPagedDecode": helper.make_graph(  # as the libraries used to take it
            [helper.make_node("MlaPagedDecode", ["q", "kv_cache", "block_tables", "seq_lens"], ["out"],
                              domain="mla_export", scale=0.1, kv_lora_rank=8)], "decode",
            [helper.make_tensor_value_info("q", f, ["B", 2, 12]), helper.make_tensor_value_info("kv_cache", f, ["N", 4, 12]),
             helper.make_tensor_value_info("block_tables", i32, ["B", "M"]),
             helper.make_tensor_value_info("seq_lens", i32, ["B"])], [helper.make_tensor_value_info("out", f, None)])}
        assert sorted(old) == sorted(ops.RETIRED)
        for retired, graph in old.items():
            model = helper.make_model(graph, opset_imports=onnx_ops.opset_imports(), ir_version=10)
            with pytest.raises(Exception, match=retired):
                ov_core().read_model(model.SerializeToString())
            if ok.available():
                with pytest.raises(Exception, match=retired):
                    ort.InferenceSession(model.SerializeToString(), sess_options=ok.session_options(),
                                         providers=["CPUExecutionProvider"])
            with pytest.raises(ValueError, match="retired"):
                ops.op(retired)


class TestAdaptersAreGeneric:
    def test_adapters_spell_no_op(self):
        for path in ADAPTERS:
            spelled = sorted(set(re.findall(r'"(Mla[A-Za-z]+)"', path.read_text())))
            assert not spelled, f"{path.name} names ops {spelled}: the adapters read the op table"

    def test_each_run_function_is_short(self):
        text = (ROOT / "custom_ops/op_table/op_runs.cpp").read_text()
        runs = re.findall(r"^void (run_\w+)\(OpCall& c\) \{\n(.*?)^\}", text, re.S | re.M)
        assert len(runs) == len(ops.names())
        for name, body in runs:
            assert body.count("\n") < 30, f"{name} has {body.count(chr(10))} lines"


class TestNewAttributeTouchesTheTableOnly:
    """An attribute added to MlaPagedAttention in table.json reaches the generated C++
    descriptors (which both adapters read: OpenVINO's attributes, its ONNX conversion and
    onnxruntime's reading are loops over them), the ONNX schema and the Python checks, with no
    other file changed; only the kernel must then read it in its run function."""

    def test_added_attribute_flows_everywhere(self, tmp_path, monkeypatch):
        table = json.loads(ops.TABLE_PATH.read_text())
        attention = next(o for o in table["ops"] if o["name"] == "MlaPagedAttention")
        attention["attributes"].append({"name": "window", "type": "int", "default": 0, "min": 0, "doc": "test"})
        edited = tmp_path / "table.json"
        edited.write_text(json.dumps(table))
        header = tmp_path / "op_table.gen.hpp"
        subprocess.run([sys.executable, str(ROOT / "custom_ops/op_table/gen_op_table.py"), str(edited), str(header)],
                       check=True)
        assert re.search(r'\{"window", AttrType::i64, true, .*?, 0, "", 0, .*?, true, 0, AttrCheck::none\}',
                         header.read_text())
        assert '"kMlaPagedAttention' not in header.read_text()
        monkeypatch.setattr(ops, "TABLE_PATH", edited)
        ops.table.cache_clear()
        try:
            schema = onnx_ops._schema(ops.op("MlaPagedAttention"), ops.table()["types"])
            assert "window" in schema.attributes
            node = onnx_ops.paged_attention_node(*"abcdefghi", "out", "n", 0.5)
            assert ops.attributes("MlaPagedAttention", {"scale": 0.5, "window": 3}) == {"scale": 0.5, "window": 3}
            with pytest.raises(ValueError, match="'window' must be >= 0"):
                ops.attributes("MlaPagedAttention", {"scale": 0.5, "window": -1})
            assert node.op_type == "MlaPagedAttention"
        finally:
            ops.table.cache_clear()


def test_a_library_of_another_table_is_refused(monkeypatch):
    """Loading a library built from another table (an older MLA_EXPORT_LIB_DIR) fails naming it:
    its ops would take attributes they do not know for their defaults (an MoE's tile16 codes for
    the 4-row layout) and answer wrong without a word."""
    from mla_export.ops import libraries

    path = libraries.extension_path()
    stale = ops.comparable(ops.table())
    stale["ops"] = [dict(o, attributes=[a for a in o["attributes"] if a["name"] != "layout"]) for o in stale["ops"]]
    monkeypatch.setattr(ops, "library_table", lambda p: stale)
    monkeypatch.setattr(libraries, "_CHECKED", set())
    with pytest.raises(RuntimeError, match=f"{path} was built from another op table"):
        libraries._check_table(path)
    monkeypatch.setattr(ops, "library_table", lambda p: ops.comparable(ops.table()))
    assert libraries._check_table(path) == path
