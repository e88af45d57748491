"""The backend's implementation: the exported graph compiled on OpenVINO's CPU plugin.

One compiled model and one infer request serve every step. The per-layer cache arrays of the
KVCacheManager are bound once, as tensors over their own memory; the graph's MlaCacheWrite op
writes the new rows straight into them, so nothing is copied per step and the numpy arrays
*are* the cache (copy-on-write and block swaps act on them directly). The int32 metadata inputs are bound
the same way, over the executor's own arrays (`metadata_tensors`), which the backend's builder
writes each step into: a steady decode step copies nothing and rebinds nothing.

That only holds when the plugin hands the op the caller's buffer. It silently makes a copy
when the bound array's type differs from what the op consumes (a Convert is inserted: e.g. a
bf16 input on a CPU without native bf16). So bf16 caches are bound as their raw bytes (see
`mla_export/ops/cache_binding.py`), and at start-up a sentinel step checks that a written row really
appears in every layer's numpy array, and stops with a clear error if not.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import openvino as ov

from .. import ops
from ..ops.libraries import ov_core
from ..ops.ov_op_errors import checked_infer, step_check
from ..ops.cache_binding import cache_binding
from ..formats.contract import Contract
from .batch_invariance import pin_attention_form_openvino
from .decode_graphs import CompiledGraph, DecodeGraphs, static_graphs_note, step_shapes
from .executor_common import CacheNotInPlaceError, MLAExecutor, check_cache_bindings
from ..ops.memory_plan import check_fits
from .metadata import MLAMetadata
from .model_dir import graph_path
from .qlinear_tiles import pack_qlinear_tiles
from .weights_memory import read_ir

__all__ = ["OpenVINOMLAExecutor", "CacheNotInPlaceError"]


class OpenVINOMLAExecutor(MLAExecutor):
    """The exported IR (or ONNX graph with the MLA ops) compiled on an OpenVINO device."""

    who = "the OpenVINO plugin"

    def __init__(self, contract: Contract, kv_caches: Sequence[np.ndarray], *, precision: str = "bf16",
                 num_threads: int | None = None, device: str = "CPU", batch_invariant: bool = False,
                 decode_graph_batches: Sequence[int] = (), decode_graphs_required: bool = False,
                 verify_tokens: int = 0, max_model_len: int | None = None):
        """decode_graph_batches: the batch sizes whose pure decode steps run on a graph compiled with
        static shapes (decode_graphs.py), their block tables padded to the blocks of max_model_len
        tokens (default: the model's positions), at most the cache's blocks; with verify_tokens
        (1 + the drafts a sequence of speculative decoding), their verify steps too. Unless
        decode_graphs_required, none are compiled where each would copy more than a small share of
        the weights (an export whose projections are the plugin's own MatMul nodes)."""
        super().__init__(contract, kv_caches, precision, num_threads)
        core = ov_core()
        path = graph_path(contract)
        self.graph_file = path.name
        weights = path.with_suffix(".bin") if path.suffix == ".xml" else path.parent / f"{path.name}.data"
        check_fits(contract.raw["export"], precision, weights)  # a clear error instead of the OOM killer
        if path.suffix == ".xml":  # the weights in huge-page memory (weights_memory.py), kept with the model
            model, self._weights_memory = read_ir(core, path, weights)
        else:
            model, self._weights_memory = core.read_model(str(path)), None
        contract.validate_openvino_model(model)
        # The arrays the graph sees: f32 caches as they are, the others as their bytes.
        self._bound = [cache_binding(c) for c in self._kv_caches]
        check_cache_bindings(contract, self._bound)
        match_moe_compute(model, precision)
        if batch_invariant:  # every chunk's attention in one form, whatever its length (batch_invariance.py)
            pin_attention_form_openvino(model)
        # VNNI CPUs (AMX or not): int8 projections in 16-row tiles; AVX512-BF16 + VBMI CPUs without
        # AMX: e4m3 ones too (qlinear_tiles.py)
        self.tiled_projections = pack_qlinear_tiles(model, self._weights_memory, precision)
        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
        if precision == "f32":  # f32 activations throughout: no dynamic int8 quantization of the inputs
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0  # of int8/int4-weight matmuls (on by default with VNNI)
        if num_threads is not None:
            config["INFERENCE_NUM_THREADS"] = num_threads
        self.compiled = core.compile_model(model, device, config)
        self._dynamic = CompiledGraph(self.compiled, self.cache_names, self._bound)
        self._active = self._dynamic  # the graph of the last step bound
        self.decode_graphs, self.decode_graphs_note = None, ""
        shapes = step_shapes(decode_graph_batches, verify_tokens)
        if shapes and (why := static_graphs_note(model, len(shapes), precision, decode_graphs_required)):
            self.decode_graphs_note, shapes = why, []
        if shapes:
            tokens = max_model_len or contract.model["max_position_embeddings"]
            self.decode_graphs = DecodeGraphs(core, model, device, config, shapes, tokens, self.cache_names,
                                              self._bound)
            self.metadata_tensors.width_rule = self.decode_graphs.table_width
        # On one thread the CPU plugin loses a node's exception and a later single-thread infer()
        # crashed the process (OpenVINO 2026.4.1): there the graph's step check is also run
        # before infer(), so a rejected step never throws inside the plugin.
        self._precheck = None
        if int(self.compiled.get_property("INFERENCE_NUM_THREADS") or 0) == 1:
            arr = self._kv_caches[0]
            self._precheck = dict(num_blocks=arr.shape[0], block_size=arr.shape[1], row_width=arr.shape[2],
                                  num_layers=contract.model["num_layers"], vocab_size=contract.model["vocab_size"],
                                  max_positions=contract.model["max_position_embeddings"])
        self.check_cache_written_in_place()

    def execute(self, metadata: MLAMetadata) -> np.ndarray:
        """Run one step; logits [B, vocab] f32, a view valid until the next call."""
        self.bind(metadata)
        return self.run()

    def bind(self, metadata: MLAMetadata) -> None:
        """Bind the step's metadata without running it (the graph alone is then `run()`). The
        builder's arrays are this executor's own (MetadataTensors.take); an input is rebound
        only when its array changed (a new shape): a tensor over the array's memory, as the
        caches are bound, so the graph reads what the builder wrote."""
        feeds = self.metadata_tensors.take(metadata)
        if self._precheck is not None:  # one thread: a bad step must never reach infer()
            step_check(feeds, **self._precheck)
        graph = self.decode_graphs.pick(feeds) if self.decode_graphs is not None else None
        self._active = graph or self._dynamic
        self._active.bind(feeds)

    @property
    def compiled_graphs(self) -> list[CompiledGraph]:
        """The dynamic graph, then the static decode graphs (profilers read every one's counters)."""
        return [self._dynamic, *(self.decode_graphs.graphs.values() if self.decode_graphs is not None else ())]

    @property
    def request(self) -> ov.InferRequest:
        """The infer request of the last step bound (a static decode graph's or the dynamic graph's)."""
        return self._active.request

    def run(self) -> np.ndarray:
        """The graph alone, on the inputs bound last."""
        checked_infer(self._active.request)  # raises even where the plugin loses an op's exception
        return self._active.request.get_tensor(self._active.logits).data

    def hidden_states(self) -> np.ndarray:
        """The last run's hidden_states output (exports with an MTP draft), a view valid until the next run."""
        if self._active.hidden is None:
            raise RuntimeError(f"{self.graph_file} has no hidden_states output (the export has no MTP draft)")
        return self._active.request.get_tensor(self._active.hidden).data

    def check_cache_written_in_place(self, out=None) -> None:
        """The sentinel step on the dynamic graph (fresh arrays: as wide as needed), and again on
        the batch-1 static decode graph (its own compiled model binds the same arrays), built into
        this executor's inputs so that it picks that graph."""
        super().check_cache_written_in_place(out)
        if out is None and self.decode_graphs is not None and self.decode_graphs.decode_graph(1) is not None:
            super().check_cache_written_in_place(self.metadata_tensors)
            assert self._active is self.decode_graphs.decode_graph(1), "the one-token sentinel step ran the batch-1 graph"

    def describe(self) -> str:
        # What the plugin really uses: a bf16 hint falls back to f32 on CPUs without bf16.
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        threads = self.compiled.get_property("INFERENCE_NUM_THREADS")
        tiles = f", {self.tiled_projections} projections' codes in 16-row tiles" if self.tiled_projections else ""
        static = (f", {self.decode_graphs.describe()}" if self.decode_graphs is not None
                  else f", {self.decode_graphs_note or 'every step on the dynamic graph'}")
        return (f"OpenVINO {ov.get_version().split('-')[0]} CPU: {self.graph_file}, inference precision {precision}, "
                f"threads {threads or 'default'}, caches written in place{tiles}{static}")

    def binding_note(self, layer: int) -> str:
        return (f"the bound array must be C-contiguous with exactly the graph input's element type (f32, or any "
                f"other format bound as u8 bytes); got {self._bound[layer].dtype} {self._bound[layer].shape}")



def match_moe_compute(model: ov.Model, precision: str) -> None:
    """Our ops compute in the precision the plugin runs the rest of the graph in: under a bf16
    hint the integer-weight ops (MlaMoeExperts, MlaQLinear) take int8 activations on VNNI CPUs
    (as the plugin's own compressed FullyConnected kernels do with their dynamic quantization) and
    MlaPagedAttention's decode rows multiply in bf16 on AMX tiles or AVX512-BF16 dot products where
    the CPU has them (as the plugin's own attention does there); f32 under an f32 hint, which keeps
    f32 runs exact. The ops cannot see the hint, so they are told here: every op of the table
    with a `compute` attribute."""
    told = set(ops.with_attribute("compute"))
    for op in model.get_ops():
        if op.get_type_name() in told:
            op.set_attribute("compute", "bf16" if precision == "bf16" else "f32")
