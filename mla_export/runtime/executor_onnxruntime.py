"""The backend's implementation on onnxruntime (CPU), the same interface as
`executor_openvino.OpenVINOMLAExecutor`: constructed on the shared per-layer cache arrays,
`execute(metadata) -> logits [B, vocab] f32`, a start-up self-check, and `describe()`.

Two paths, picked at construction:
- "custom": `model.onnx` (the graph with the MLA ops) in a session that has the mla-export
  custom-op library (`libmla_export_ort.so`) registered. The caches are bound once through
  IOBinding as OrtValues over the arrays' own memory (bf16 caches as their u8 bytes, as the
  graph declares them), and MlaCacheWrite writes the new rows straight into them: nothing is
  copied per step, the numpy arrays *are* the cache. A sentinel step at start-up checks it.
- "portable": `model_portable.onnx` (standard ONNX ops in model-local functions, no library),
  used when the library was not built or the export has no `model.onnx`. Its caches go in as
  inputs and come back as `kv_cache_out.<i>` outputs, copied into the cache arrays after every
  step (one full cache copy per layer per step: correct, but slow for big caches).

Threads: `num_threads` sets the session's intra-op pool, which both onnxruntime's own kernels
and the MLA kernels run on (and the MLA kernels' work split). `precision` is accepted for the
engine's interface but onnxruntime has no inference-precision hint: the graph runs in the
dtypes it was exported with.

Imports onnxruntime, numpy and ml_dtypes only (never torch, onnx or openvino).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Sequence

import numpy as np

from ..ops.libraries import ort_ops_path
from ..ops import ort_tensors
from ..ops.kernel_config import library_config
from ..ops.cache_binding import cache_binding
from ..formats.contract import Contract
from ..formats.contract_error import ContractError
from .batch_invariance import pinned_onnx_bytes
from .executor_common import CacheNotInPlaceError, MLAExecutor, check_cache_bindings
from .metadata import MLAMetadata

__all__ = ["OnnxRuntimeMLAExecutor", "CacheNotInPlaceError", "VARIANTS"]

log = logging.getLogger("mla_export.runtime")

VARIANTS = ("auto", "custom", "portable")


def _ort():
    from ..deps import require

    return require("onnxruntime", "the onnxruntime runtime")  # MissingDependency names the extra


def choose_variant(contract: Contract, variant: str = "auto") -> tuple[str, str]:
    """(variant, reason): which graph the executor runs and why."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    has_custom = contract.graph_path("onnx") is not None
    has_portable = contract.graph_path("onnx_portable") is not None
    lib = ort_ops_path()
    if variant == "custom" or (variant == "auto" and has_custom and lib):
        if not has_custom:
            raise ContractError(f"{contract.out_dir}: the export has no ONNX graph with the MLA ops (model.onnx); "
                                "export with --format onnx or both")
        if not lib:
            raise FileNotFoundError(
                "the mla-export onnxruntime custom-op library (libmla_export_ort.so) is not installed: run "
                "tools/fetch_ort_headers.sh and reinstall the package, or use the portable ONNX graph")
        return "custom", f"custom-op library {lib}"
    if variant == "auto":
        if not has_portable:
            why = ("the custom-op library libmla_export_ort.so is not installed" if has_custom
                   else "the export has no model.onnx")
            raise ContractError(
                f"{contract.out_dir}: cannot run on onnxruntime: {why}, and the export has no portable ONNX graph "
                "(export with --format onnx --portable)")
        why = "the export has no model.onnx" if not has_custom else "libmla_export_ort.so is not installed"
        return "portable", f"portable ONNX functions ({why})"
    if not has_portable:
        raise ContractError(f"{contract.out_dir}: the export has no portable ONNX graph (export with --portable)")
    return "portable", "portable ONNX functions (asked for)"


class OnnxRuntimeMLAExecutor(MLAExecutor):
    """The exported ONNX graph (with the MLA ops, or portable) in an onnxruntime CPU session."""

    who = "onnxruntime"

    def __init__(self, contract: Contract, kv_caches: Sequence[np.ndarray], *, precision: str = "bf16",
                 num_threads: int | None = None, variant: str = "auto", batch_invariant: bool = False):
        super().__init__(contract, kv_caches, precision, num_threads)
        ort = _ort()
        self.variant, self._reason = choose_variant(contract, variant)
        # The arrays the graph sees: the custom graph takes all but f32 caches as u8 bytes.
        self._bound = [cache_binding(c) if self.variant == "custom" else c for c in self._kv_caches]
        check_cache_bindings(contract, self._bound, self.variant)

        if self.variant == "custom":
            so = ort_tensors.session_options(num_threads)
            path = contract.graph_path("onnx")
        else:
            so = ort.SessionOptions()
            if num_threads is not None:
                so.intra_op_num_threads = num_threads
            path = contract.graph_path("onnx_portable")
            log.warning("onnxruntime: running %s with %s; caches are returned and copied back every step",
                        path.name, self._reason)
        self.graph_file = path.name
        model = str(path)
        if batch_invariant:
            if self.variant != "custom":
                raise ValueError(f"batch_invariant needs the custom-op graph ({self._reason}): the portable "
                                 "graph's attention is made of onnxruntime's own ops, not checked for it")
            model = pinned_onnx_bytes(path)  # the weights stay in the export's external data files
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
        self.session = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
        io_variant = "custom" if self.variant == "custom" else "portable"
        contract.validate_model_io([(i.name, i.shape, i.type) for i in self.session.get_inputs()],
                                   [(o.name, o.shape, o.type) for o in self.session.get_outputs()], io_variant)
        self._cache_values = [ort_tensors.ortvalue(a) for a in self._bound]  # over the arrays' memory
        self._io = self.session.io_binding()
        for name, v in zip(self.cache_names, self._cache_values):
            self._io.bind_ortvalue_input(name, v)
        self._meta_bound: dict[str, tuple] = {}  # metadata input -> (the array, its OrtValue) bound
        self._outputs = ["logits"]
        if self.variant == "portable":
            self._outputs += [f"kv_cache_out.{i}" for i in range(len(self._kv_caches))]
        # Exports with an MTP draft: every new token's hidden state too (last, after the caches)
        self._has_hidden = any(o.name == "hidden_states" for o in self.session.get_outputs())
        if self._has_hidden:
            self._outputs.append("hidden_states")
        self._last_outputs = None
        self.check_cache_written_in_place()

    # -- steps -----------------------------------------------------------------------------------

    def execute(self, metadata: MLAMetadata) -> np.ndarray:
        """Run one step; logits [B, vocab] f32."""
        # The builder's arrays are this executor's own (MetadataTensors.take: other metadata is
        # checked and copied in); an input is rebound only when its array changed (a new shape),
        # as an OrtValue over the array's memory, so the graph reads what the builder wrote.
        bound = self._meta_bound
        for name, arr in self.metadata_tensors.take(metadata).items():
            held = bound.get(name)
            if held is None or held[0] is not arr:
                value = ort_tensors.ortvalue(arr)
                bound[name] = (arr, value)  # both kept alive while bound
                self._io.bind_ortvalue_input(name, value)
        # Outputs unallocated every step: onnxruntime allocates them at this step's shapes (a
        # binding kept from the previous step would pin its [B, vocab] shape).
        self._io.clear_binding_outputs()
        for name in self._outputs:
            self._io.bind_output(name)
        self.session.run_with_iobinding(self._io)
        outputs = self._last_outputs = self._io.get_outputs()
        if self.variant == "portable":
            for cache, value in zip(self._kv_caches, outputs[1:]):
                _copy_into(cache, value)
        return outputs[0].numpy()

    def hidden_states(self) -> np.ndarray:
        """The last run's hidden_states output (exports with an MTP draft)."""
        if not self._has_hidden or self._last_outputs is None:
            raise RuntimeError(f"{self.graph_file} has no hidden_states output (the export has no MTP draft)")
        return self._last_outputs[-1].numpy()

    def binding_note(self, layer: int) -> str:
        return f"{super().binding_note(layer)}, {self.graph_file}"

    # -- facts -----------------------------------------------------------------------------------

    def describe(self) -> str:
        ort = _ort()
        threads = self.num_threads if self.num_threads is not None else "default"
        if self.variant == "custom":
            isa = _library_isa()
            return (f"onnxruntime {ort.__version__} CPU: {self.graph_file} with the mla_export custom-op library "
                    f"({isa} kernels), caches written in place, intra-op threads {threads}")
        return (f"onnxruntime {ort.__version__} CPU: {self.graph_file}, {self._reason}, caches returned as "
                f"outputs and copied back each step, intra-op threads {threads}")


def _library_isa() -> str:
    path = ort_ops_path()
    if not path:
        return "unknown"
    return library_config(path).isa


_ELEM_BYTES = {"tensor(float)": 4, "tensor(bfloat16)": 2, "tensor(float16)": 2, "tensor(uint8)": 1}


def _copy_into(cache: np.ndarray, value) -> None:
    """cache[...] = the OrtValue's contents (same shape and element size), without a temporary."""
    shape = tuple(value.shape())
    if shape != cache.shape:
        raise RuntimeError(f"the portable graph returned a cache of shape {shape}, the bound cache is {cache.shape}")
    if hasattr(value, "tensor_size_in_bytes"):
        size = value.tensor_size_in_bytes()
    else:  # onnxruntime < 1.22: from the element type
        size = _ELEM_BYTES.get(value.data_type(), -1) * int(np.prod(shape))
    if size != cache.nbytes:
        raise RuntimeError(f"the portable graph returned {value.data_type()} for a {cache.dtype} cache")
    ctypes.memmove(cache.ctypes.data, value.data_ptr(), cache.nbytes)
