"""Batch-invariant mode: a request's logits do not depend on what else is scheduled with it, nor on
how its prompt was cut into chunks or found in the prefix cache (vLLM's batch-invariant mode).

What moves a request's numbers with the batch, measured on an AMD Zen 4 (AVX-512 VNNI/BF16, no
AMX), the tiny preset, 16 prompts answered one by one and then all at once, 32 greedy tokens:
- MlaPagedAttention's automatic form (mla_kernels.hpp, choose_form): each sequence's chunk runs
  absorbed or expanded by the cost of its qlen new tokens over seq_len positions. A prompt whose
  first blocks an earlier request cached (or whose prefill the token budget cut) runs its other
  tokens as a shorter chunk, which may take the other form: the same position is then summed in
  another order. Pinning the form (absorbed, what decode runs anyway) removed every difference of
  the int8 and int4 exports at the bf16 hint (1 of 16 answers moved before, 0 after).
- Our integer-weight ops (MlaQLinear, MlaMoeExperts) under compute bf16 take int8 activations
  (per-row scales, integer sums, one fold order) on VNNI and AVX2 tables: the same bits for a
  row at any row count. At compute f32 they dequantise panels from 8 rows on, which sums in
  another order than the 1-7 row dots: refused (onnxruntime always runs them at f32).
- The plugin's own nodes in an int8/int4 export under a bf16 hint (compressed FullyConnected with
  dynamic quantization, the router's bf16 FullyConnected, RMS, TopK, element-wise) gave each row
  the same bits at M = 1..600 alone and in the model. Under an f32 hint its compressed
  FullyConnected (projections MlaQLinear cannot hold) dequantises instead and changes kernel from
  M = 2: one more reason integer weights are refused at f32.
- The plugin's grouped MoE (float-weight exports: --weight-format bf16/f16/f32, or --moe-form
  grouped / gather_matmul) under a bf16 hint is not invariant (3-11 of 16 moved with the form
  pinned; the node that reorders its sums was not pinned down): refused at bf16. At f32 float
  exports are invariant (OpenVINO and onnxruntime, 0 of 16).
Not checked: the AMX tile paths (Intel Sapphire Rapids and later), fp8 weights (refused).

The cost is prefill attention at long prompts (absorbed reads the latent rows once per query row
instead of expanding keys once per chunk); decode runs absorbed already. Measured: time to first
token 1.28x at 1024 prompt tokens, 1.77x at 4096 (docs/BENCHMARKS.md), hence a switch.
"""

from __future__ import annotations

from pathlib import Path

from ..formats.contract import Contract
from ..ops import kernel_config

__all__ = ["ABSORBED", "problem", "pin_attention_form_openvino", "pinned_onnx_bytes"]

ABSORBED = 1  # MlaPagedAttention's `form` attribute: 0 automatic, 1 absorbed, 2 expanded

# The MoE forms whose experts run as the plugin's own nodes (export/moe.py), not MlaMoeExperts.
_PLUGIN_MOE_FORMS = ("grouped", "gather_matmul")
_INTEGER_FORMATS = ("int8", "int4")


def problem(contract: Contract, precision: str, runtime: str) -> str | None:
    """Why this export cannot run batch-invariantly at `precision` on `runtime`, or None when it can."""
    export = contract.raw.get("export") or {}
    wformat = export.get("weight_format")
    moe_form = export.get("moe_form")
    has_moe = int(contract.model.get("n_routed_experts") or 0) > 0
    if wformat == "fp8":
        return "fp8 weights: their kernels' row paths were not checked for it; export int8 or int4 weights"
    if wformat in _INTEGER_FORMATS:
        # Our integer-weight ops give each row the same bits at any row count only where they take
        # int8 activations (integer sums, then one fixed fold): compute bf16 on a VNNI or AVX2 table.
        # At f32 they dequantise panels from 8 rows on, which sums in another order than the dots.
        if runtime != "openvino" or precision != "bf16":
            where = "onnxruntime runs them" if runtime != "openvino" else "precision f32 runs them"
            return (f"{wformat} weights: {where} at f32, where MlaQLinear / MlaMoeExperts change kernel with the "
                    "number of rows; use OpenVINO at precision bf16, or an export with float weights")
        isa = kernel_config.config().isa
        if not (isa == "avx2" or (isa == "avx512" and "avx512_vnni" in kernel_config.cpu_features())):
            return (f"{wformat} weights: this CPU's kernels ({isa}, no VNNI) take no int8 activations, and their f32 "
                    "path changes kernel with the number of rows; use an export with float weights at precision f32")
    if runtime == "openvino" and precision == "bf16" and has_moe and moe_form in _PLUGIN_MOE_FORMS:
        return (f"this export's MoE experts run as OpenVINO's own nodes (moe_form {moe_form!r}, weight format "
                f"{wformat!r}), whose bf16 sums depend on the batch; re-export with --weight-format int8 or int4 "
                "(the fused MlaMoeExperts op), or run with precision f32")
    return None


def pin_attention_form_openvino(model) -> int:
    """Every MlaPagedAttention node of an OpenVINO model runs absorbed; returns how many."""
    n = 0
    for op in model.get_ops():
        if op.get_type_name() == "MlaPagedAttention":
            op.set_attribute("form", ABSORBED)
            n += 1
    return n


def pinned_onnx_bytes(path: Path) -> bytes:
    """An export's model.onnx with its MlaPagedAttention nodes pinned absorbed, serialized for
    onnxruntime (which takes no attribute change after loading). Only the graph is read: the
    weights stay in their external data files, which the session then finds through
    `session.model_external_initializers_file_folder_path` (the export's directory); the export
    itself is never written. Needs the `onnx` package (the export extra)."""
    try:
        import onnx
    except ImportError:
        raise ImportError("batch_invariant on onnxruntime rewrites one attribute of model.onnx and needs the onnx "
                          "package: pip install 'mla-export[export]'") from None
    model = onnx.load(str(path), load_external_data=False)
    pinned = 0
    for node in model.graph.node:
        if node.op_type == "MlaPagedAttention" and node.domain == "mla_export":
            kept = [a for a in node.attribute if a.name != "form"]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute("form", ABSORBED)])
            pinned += 1
    if pinned == 0:
        raise ValueError(f"{path}: no MlaPagedAttention node to pin (batch_invariant needs the custom-op graph)")
    return model.SerializeToString()
