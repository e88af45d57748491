"""The export's MTP draft graph (export/mtp.py) compiled on the engine's runtime.

One compiled model on a latent cache array of its own (`kv_cache.<N>`, shaped as a main layer's
cache and bound once, written in place as the main graph's caches are) and, for a sparse-attention
model (DeepSeek-V3.2, GLM-5), an indexer-key cache of its own (`index_cache.<N>`, shaped as a main
indexer layer's). The draft reads the main cache's block tables and slots, so its rows live at the
same slots in its own arrays: the KVCacheManager's blocks serve all, and a block copy
(copy-on-write) is applied to them as to every main layer (backend.py). `run(metadata, hidden)`
-> (draft logits [L, vocab], h' [L, hidden]).

Needs the custom-op graph: OpenVINO compiles mtp_draft.xml (or mtp_draft.onnx), onnxruntime runs
mtp_draft.onnx with the mla-export op library (the draft has no portable form).
"""

from __future__ import annotations

import numpy as np

from ..ops.libraries import ort_ops_path
from ..ops.cache_binding import cache_binding
from ..formats.contract import Contract
from ..formats.contract_error import ContractError
from .executor_common import check_cache_written_in_place, check_options
from .graph_feeds import graph_feeds
from .metadata import METADATA_INPUTS, MLAMetadata

__all__ = ["MTPDraftRunner", "mtp_problem", "draft_cache_names"]


def mtp_problem(contract: Contract, runtime: str) -> str | None:
    """Why the export's MTP draft cannot run on `runtime` (None: it can)."""
    mtp = contract.mtp
    if mtp is None:
        return (f"the export in {contract.out_dir} has no MTP draft graph (its checkpoint has no "
                "num_nextn_predict_layers MTP layer with weights, e.g. DeepSeek-V2/V2-Lite, or it was exported "
                "before MTP drafts were; export a checkpoint that carries one, such as DeepSeek-V3/R1/V3.2 or "
                "GLM-5, or use method 'ngram')")
    if runtime == "openvino" and not (contract.mtp_path("openvino_xml") or contract.mtp_path("onnx")):
        return "the export's MTP draft has neither mtp_draft.xml nor mtp_draft.onnx"
    if runtime == "onnxruntime":
        if contract.mtp_path("onnx") is None:
            return "the export's MTP draft has no mtp_draft.onnx for onnxruntime (export with --format onnx or both)"
        if not ort_ops_path():
            return ("the MTP draft runs on the mla-export onnxruntime op library (libmla_export_ort.so), which is "
                    "not installed")
    return None


def draft_cache_names(contract: Contract) -> list[str]:
    """The draft graph's cache inputs, in order: kv_cache.<N>, then index_cache.<N> when the model
    has sparse attention (the draft's layer runs its own indexer)."""
    n = contract.mtp["layer_index"]
    return [f"kv_cache.{n}"] + ([f"index_cache.{n}"] if contract.cache.get("index") else [])


class MTPDraftRunner:
    """The draft graph on `caches` (draft_cache_names' arrays: shaped and typed as a main layer's
    latent cache, then as a main indexer layer's key cache for a sparse-attention model)."""

    def __init__(self, contract: Contract, caches, *, runtime: str, precision: str = "bf16",
                 num_threads: int | None = None):
        check_options(precision, num_threads)
        why = mtp_problem(contract, runtime)
        if why:
            raise ContractError(why)
        self.hidden_size = contract.mtp["hidden_size"]
        self.cache_names = draft_cache_names(contract)
        if isinstance(caches, np.ndarray) or len(caches) != len(self.cache_names):
            raise ValueError(f"the MTP draft binds {len(self.cache_names)} cache array(s) "
                             f"({', '.join(self.cache_names)}), got "
                             f"{'one array' if isinstance(caches, np.ndarray) else len(caches)}")
        self.caches = list(caches)
        self._bound = [cache_binding(c) for c in self.caches]  # as the main caches: any non-f32 format as its bytes
        specs = {s.name: s for s in contract.inputs("mtp")}
        for name, bound in zip(self.cache_names, self._bound):
            spec = specs[name]
            want = np.float32 if spec.dtype == "f32" else np.uint8
            if bound.dtype != want or bound.shape[1:] != tuple(spec.shape[1:]):
                raise ValueError(f"the MTP draft's {name} is {spec.dtype} {list(spec.shape)}; the cache binds "
                                 f"{bound.dtype} {list(bound.shape)}")
        self._impl = (_OpenVINODraft if runtime == "openvino" else _OrtDraft)(
            contract, dict(zip(self.cache_names, self._bound)), self.caches[0], precision, num_threads)
        check_cache_written_in_place(
            lambda m: self.run(m, np.zeros((len(m.input_ids), self.hidden_size), np.float32))[0], self.caches,
            f"the MTP draft graph ({runtime})",
            lambda i: f"bound {self._bound[i].dtype} {list(self._bound[i].shape)}", self.cache_names)

    def run(self, metadata: MLAMetadata, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One draft step: (logits [L, vocab], h' [L, hidden]) of the rows metadata.logits_indices picks.
        hidden [T, hidden] f32: row t's previous hidden state (the main model's, or an earlier h')."""
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        if hidden.shape != (len(metadata.input_ids), self.hidden_size):
            raise ValueError(f"the MTP draft's hidden_states must be [{len(metadata.input_ids)}, {self.hidden_size}], "
                             f"got {list(hidden.shape)}")
        return self._impl.run(graph_feeds(metadata), hidden)

    def describe(self) -> str:
        return self._impl.describe()


class _OpenVINODraft:
    def __init__(self, contract: Contract, bound: dict[str, np.ndarray], cache: np.ndarray, precision: str,
                 num_threads):
        import openvino as ov

        from ..ops.libraries import ov_core
        from ..ops.ov_tensors import shared_tensor
        from .executor_openvino import match_moe_compute

        self._ov = ov
        path = contract.mtp_path("openvino_xml") or contract.mtp_path("onnx")
        self.graph_file = path.name
        model = ov_core().read_model(str(path))
        contract.validate_model_io([(p.get_any_name(), list(p.get_partial_shape()), p.get_element_type())
                                    for p in model.inputs],
                                   [(p.get_any_name(), list(p.get_partial_shape()), p.get_element_type())
                                    for p in model.outputs], "mtp")
        match_moe_compute(model, precision)
        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
        if precision == "f32":  # as the main executor: no dynamic int8 quantization of activations
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
        if num_threads is not None:
            config["INFERENCE_NUM_THREADS"] = num_threads
        self.compiled = ov_core().compile_model(model, "CPU", config)
        self.request = self.compiled.create_infer_request()
        for name, arr in bound.items():
            self.request.set_tensor(name, shared_tensor(arr))
        # On one thread the plugin can lose an op's exception (executor_openvino.py): check first.
        self._precheck = None
        if int(self.compiled.get_property("INFERENCE_NUM_THREADS") or 0) == 1:
            self._precheck = dict(num_blocks=cache.shape[0], block_size=cache.shape[1], row_width=cache.shape[2],
                                  num_layers=1, vocab_size=contract.model["vocab_size"],
                                  max_positions=contract.model["max_position_embeddings"])

    def run(self, feeds: dict, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from ..ops.ov_op_errors import checked_infer, step_check

        if self._precheck is not None:
            step_check(feeds, **self._precheck)
        ov = self._ov
        for name in METADATA_INPUTS:
            self.request.set_tensor(name, ov.Tensor(feeds[name]))
        self.request.set_tensor("hidden_states", ov.Tensor(hidden))
        checked_infer(self.request)
        return (np.array(self.request.get_tensor("logits").data),
                np.array(self.request.get_tensor("mtp_hidden_states").data))

    def describe(self) -> str:
        return f"MTP draft {self.graph_file} on OpenVINO"


class _OrtDraft:
    def __init__(self, contract: Contract, bound: dict[str, np.ndarray], cache: np.ndarray, precision: str,
                 num_threads):
        from ..ops import ort_tensors
        from ..deps import require

        ort = require("onnxruntime", "the onnxruntime runtime")
        path = contract.mtp_path("onnx")
        self.graph_file = path.name
        self.session = ort.InferenceSession(str(path), sess_options=ort_tensors.session_options(num_threads),
                                            providers=["CPUExecutionProvider"])
        contract.validate_model_io([(i.name, i.shape, i.type) for i in self.session.get_inputs()],
                                   [(o.name, o.shape, o.type) for o in self.session.get_outputs()], "mtp")
        self._ortvalue = ort_tensors.ortvalue
        self._caches = {name: ort_tensors.ortvalue(arr) for name, arr in bound.items()}  # over the arrays' memory
        self._io = self.session.io_binding()
        for name, value in self._caches.items():
            self._io.bind_ortvalue_input(name, value)

    def run(self, feeds: dict, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = []  # the OrtValues wrap the arrays (no copy): kept alive through the run
        for name, arr in list(feeds.items()) + [("hidden_states", hidden)]:
            value = self._ortvalue(arr)
            keep.append(value)
            self._io.bind_ortvalue_input(name, value)
        self._io.clear_binding_outputs()
        self._io.bind_output("logits")
        self._io.bind_output("mtp_hidden_states")
        self.session.run_with_iobinding(self._io)
        logits, h = self._io.get_outputs()
        return logits.numpy(), h.numpy()

    def describe(self) -> str:
        return f"MTP draft {self.graph_file} on onnxruntime"
