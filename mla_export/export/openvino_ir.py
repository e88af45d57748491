"""OpenVINO IR from the custom-op ONNX graph: read with the MLA extension (its ONNX frontend
mapping turns the `mla_export` nodes into the extension's ops), saved without fp16 compression
so that weights keep the export's dtype (bf16/f16 weights stay Const -> Convert pairs)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["convert_to_ir", "IR_XML", "IR_BIN"]

IR_XML, IR_BIN = "openvino_model.xml", "openvino_model.bin"


def convert_to_ir(onnx_path: Path, out_dir: Path):
    """Write openvino_model.xml/.bin into out_dir; returns the ov.Model that was saved."""
    import openvino as ov

    from .. import ov_core

    model = ov_core().read_model(str(onnx_path))
    ov.save_model(model, str(Path(out_dir) / IR_XML), compress_to_fp16=False)
    return model
