"""Checkpoint -> ONNX -> OpenVINO IR with the paged latent cache, plus the graph contract.

Modules: `weights` (safetensors reader), `graph` (node builder, external weights), `layers`
(the decoder layer's math), `moe` (router + routed experts, grouped or gather_matmul form),
`model` (the whole graph, its variants), `openvino_ir`,
`tokenizer_files`, `exporter` (`export_model`, all-or-nothing), `summary`.
"""

from .exporter import ExportError, ExportResult, export_model

__all__ = ["ExportError", "ExportResult", "export_model"]
