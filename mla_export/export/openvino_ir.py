"""OpenVINO IR from the custom-op ONNX graph: read with the MLA extension (its ONNX frontend
mapping turns the `mla_export` nodes into the extension's ops), weights kept in the export's
dtype (bf16/f16 weights stay Const -> Convert pairs, int8/int4 their codes).

The IR's weights file is the ONNX graph's own external data file, not a copy of it. An IR .bin is
raw constant bytes at offsets its .xml names, and the ONNX data file already holds every large
weight, aligned, in the very bytes OpenVINO wants (little-endian; u4 two per byte, low nibble
first in both formats). So the .xml is serialised with its .bin discarded, each large Const is
pointed at its initializer's offset in the data file, the few small constants (inline
initializers, shapes the frontend made) are appended to it, and the file becomes the .bin
(hard-linked when model.onnx is kept too). That halves the disk an export needs and skips writing
every weight a second time: for a 31 GB checkpoint, 16 GB (int8) instead of 32 GB beside it.
Anything unexpected (a constant whose size differs from its initializer's) falls back to
OpenVINO's own save_model.

ONNX's MatMul has no transpose_b, so a batched MatMul on a stacked [E, out, in] expert weight
arrives as MatMul(x, Transpose(w, [0, 2, 1])); `_fold_weight_transposes` writes it as
MatMul(x, w, transpose_b=True), the form OpenVINO's MoE passes match and the CPU plugin
decompresses on the fly: the weight (and its decompression chain) keeps its [..., out, in] layout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from xml.sax.saxutils import unescape

__all__ = ["convert_to_ir", "IR_XML", "IR_BIN"]

IR_XML, IR_BIN = "openvino_model.xml", "openvino_model.bin"
_WEIGHT_CHAIN_OPS = {"Constant", "Convert", "Subtract", "Multiply", "Reshape"}


def _is_constant_weight(output) -> bool:
    """A Constant, or a decompression chain (Convert / Subtract / Multiply / Reshape) of Constants."""
    node = output.get_node()
    if node.get_type_name() not in _WEIGHT_CHAIN_OPS:
        return False
    return all(_is_constant_weight(i.get_source_output()) for i in node.inputs())


def _swaps_last_two(transpose) -> bool:
    perm_node = transpose.input(1).get_source_output().get_node()
    if perm_node.get_type_name() != "Constant":
        return False
    perm = [int(v) for v in perm_node.get_vector()]
    n = len(perm)
    return n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]


def _fold_weight_transposes(model) -> int:
    """MatMul(a, Transpose(w, swap last two)) -> MatMul(a, w, transpose_b=True) for constant
    weights w; returns how many were folded."""
    import openvino.opset13 as ops

    folded = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or node.get_attributes()["transpose_b"]:
            continue
        tr = node.input(1).get_source_output().get_node()
        if tr.get_type_name() != "Transpose" or not _swaps_last_two(tr):
            continue
        w = tr.input(0).get_source_output()
        if not _is_constant_weight(w):
            continue
        new = ops.matmul(node.input(0).get_source_output(), w, node.get_attributes()["transpose_a"], True)
        new.set_friendly_name(node.get_friendly_name())
        node.output(0).replace(new.output(0))
        folded += 1
    return folded
_ALIGN = 64
_CONST = re.compile(r'(<layer id="\d+" name="([^"]*)" type="Const" version="opset1">\s*<data [^>]*?)'
                    r'offset="(\d+)" size="(\d+)"')


def _external_initializers(onnx_path: Path, data_name: str) -> dict[str, tuple[int, int]]:
    """name -> (offset, length) of every initializer stored in `data_name`."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    found = {}
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            if info.get("location") == data_name:
                found[t.name] = (int(info.get("offset", 0)), int(info["length"]))
    return found


def convert_to_ir(onnx_path: Path, out_dir: Path, data_path: Path, keep_data_file: bool,
                  xml_name: str | None = None, bin_name: str | None = None):
    """Write openvino_model.xml/.bin (or xml_name/bin_name: the MTP draft's) into out_dir; returns
    the ov.Model that was converted.

    data_path: the ONNX external data file; it becomes the .bin (kept under its own name as well
    when keep_data_file, e.g. for --format both)."""
    import openvino as ov

    from ..ops.libraries import ov_core

    out_dir, data_path = Path(out_dir), Path(data_path)
    model = ov_core().read_model(str(onnx_path))
    if _fold_weight_transposes(model):
        model.validate_nodes_and_infer_types()
    xml_path, bin_path = out_dir / (xml_name or IR_XML), out_dir / (bin_name or IR_BIN)
    external = _external_initializers(Path(onnx_path), data_path.name)
    consts = {n.get_friendly_name(): n for n in model.get_ordered_ops() if n.get_type_name() == "Constant"}
    ov.serialize(model, str(xml_path), os.devnull)  # the .xml only: its offsets are rewritten below
    xml = xml_path.read_text()
    appended: dict[int, int] = {}  # id of a constant node -> its offset in the data file
    with open(data_path, "r+b") as data:
        end = data.seek(0, os.SEEK_END)

        def place(match: re.Match) -> str:
            head, name, size = match.group(1), unescape(match.group(2), {"&quot;": '"'}), int(match.group(4))
            ext = external.get(name)
            if ext is not None and ext[1] == size:
                return f'{head}offset="{ext[0]}" size="{size}"'
            node = consts.get(name)
            if node is None:
                raise _Fallback(f"constant {name!r} is not in the model")
            if id(node) not in appended:
                raw = node.get_tensor_view().data.tobytes()
                if len(raw) != size:
                    raise _Fallback(f"constant {name!r}: {len(raw)} bytes, the IR says {size}")
                data.write(b"\0" * ((-data.tell()) % _ALIGN))
                appended[id(node)] = data.tell()
                data.write(raw)
            return f'{head}offset="{appended[id(node)]}" size="{size}"'

        try:
            xml = _CONST.sub(place, xml)
        except _Fallback:
            data.truncate(end)
            ov.save_model(model, str(xml_path), compress_to_fp16=False)
            return model
    xml_path.write_text(xml)
    if keep_data_file:
        os.link(data_path, bin_path)
    else:
        data_path.rename(bin_path)
    return model


class _Fallback(Exception):
    """The shared-file conversion cannot describe this model: OpenVINO writes its own .bin."""
