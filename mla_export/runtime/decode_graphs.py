"""Decode steps on graphs compiled with static shapes (OpenVINO), as vLLM captures CUDA graphs for
its decode batch sizes: the same model, the same weights, one compiled graph per batch size B.

Why: OpenVINO's CPU plugin cannot know the output shapes of our custom ops without running them,
so in a graph with dynamic input shapes it treats every one of them as data-dependent: before
each call it clones the op with every input as a Constant and re-runs its shape inference, and
the node becomes a sync point (docs/ARCHITECTURE.md, "What each of our nodes costs in OpenVINO").
That is ~20-30 us a node, ~200 nodes a step on a 27-layer model. In a graph whose inputs all
have static shapes the plugin infers every shape once, at compile time, and a step runs only the
kernels. A decode step's inputs have static shapes once its batch size B is fixed and its block
tables are padded to one width M (the longest sequence the cache or the model allows); the extra
columns hold block 0, which no kernel reads (every kernel stops at seq_lens).

What runs here: a pure decode step (one new token per sequence, one logits row per sequence) of
a batch size in the list, and, with speculative decoding of k drafts a sequence, a verify step of
such a batch with every sequence's k drafts (k + 1 tokens and logits rows a sequence). Everything
else (prefill chunks, mixed steps, other shapes) runs on the dynamic graph. Every graph binds the caller's cache arrays
and reads our ops' weights where they lie; the plugin's own MatMul nodes repack theirs into each
compiled model, and each static graph holds some memory of its own (the rules below).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import openvino as ov

from .. import envs
from ..ops import memory_plan
from ..ops.ov_tensors import shared_tensor

__all__ = ["CompiledGraph", "DecodeGraphs", "default_batches", "parse_batches", "matmul_weight_bytes",
           "static_graphs_note", "step_shapes"]

# The batch sizes compiled by default (those up to max_num_seqs), as vLLM's capture sizes begin.
# Each costs a compile (~1 s at 27 layers) and ~2-3% of the weights' size in memory of its own
# (measured: 30-50 MB a graph for a 1.7 GB 3-layer V2-Lite int8 export, 300 MB for the 15.9 GB
# 27-layer one); other decode batch sizes run on the dynamic graph.
DEFAULT_BATCHES = (1, 2, 4, 8)
GRAPH_SHARE = 0.03  # a static graph's own memory, as a share of the weights (for the memory check)
# Without the plugin's snippets (its generated kernels for runs of elementwise ops and small MLPs).
# OpenVINO 2026.4.1 crashed while compiling static decode graphs with them, inside its snippets
# tokenization (right after TokenizeMLPSeqSnippets), at some batch sizes only: 4, 6 and 8 of a tiny
# f32 DeepSeek-V3. At decode sizes they gained nothing: a 27-layer tiny int8 step took 4.4 ms
# without them, 5.0 ms with (Zen 4, 2 threads, 3 alternated rounds).
STATIC_CONFIG = {"SNIPPETS_MODE": "DISABLE"}


# The plugin repacks the weights of its own MatMul nodes into every compiled model (our ops read
# theirs where they lie, shared): a bf16 export whose projections are MatMuls would hold one more
# copy per static graph (a 3-layer V2-Lite bf16 export: 2.7 GB each; eight took the process past
# 22 GB). By default static graphs are compiled only where those copies cost at most this share
# of the weights (quantized exports, whose projections are our ops: their router weights), or this
# many bytes (small models).
MAX_COPIED_SHARE, MAX_COPIED_BYTES = 0.02, 256 << 20
_PASS_THROUGH = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose", "Unsqueeze"}


def matmul_weight_bytes(model: ov.Model) -> tuple[int, int]:
    """(bytes of the constants that feed the plugin's own MatMul nodes, directly or through a
    decompression chain; bytes of every constant): what a static graph would copy, of all."""
    copied = total = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        size = op.get_byte_size()
        total += size
        todo = [t.get_node() for t in op.output(0).get_target_inputs()]
        seen = 0
        while todo and seen < 16:
            node, seen = todo.pop(), seen + 1
            if node.get_type_name() == "MatMul":
                copied += size
                break
            if node.get_type_name() in _PASS_THROUGH:
                todo.extend(t.get_node() for t in node.output(0).get_target_inputs())
    return copied, total


def static_graphs_note(model: ov.Model, count: int, precision: str, required: bool) -> str:
    """Why `count` static decode graphs of `model` are left out ("" = compile them); raises
    InsufficientMemoryError when they are `required` and cannot fit in the memory available."""
    copied, total = matmul_weight_bytes(model)
    copies = copied * count * (2 if precision == "f32" else 1)  # f32 inference widens 2-byte weights
    gib = 1 << 30
    if not required and copies > max(MAX_COPIED_SHARE * total, MAX_COPIED_BYTES):
        return (f"every step on the dynamic graph: each static decode graph would hold its own copy of the "
                f"{copied / gib:.2f} GiB of weights the plugin's MatMul nodes repack (decode_graph_batches to "
                f"compile anyway)")
    need = copies + int(count * GRAPH_SHARE * total)
    have = memory_plan.available_bytes()
    if have is None or need <= have or envs.get(memory_plan.SKIP_ENV):
        return ""
    why = (f"{count} static decode graphs would need about {need / gib:.1f} GiB (each ~{GRAPH_SHARE:.0%} of the "
           f"weights{', plus its copy of the MatMul weights' if copies else ''}), but only {have / gib:.1f} GiB is "
           f"available")
    if required:
        raise memory_plan.InsufficientMemoryError(
            f"decode_graph_batches: {why}: pass fewer batch sizes, or none (set {memory_plan.SKIP_ENV}=1 to compile "
            f"anyway)")
    return f"every step on the dynamic graph: {why}"


def default_batches(max_num_seqs: int) -> tuple[int, ...]:
    return tuple(b for b in DEFAULT_BATCHES if b <= max_num_seqs)


def parse_batches(value: Iterable[int] | str | None, what: str = "decode_graph_batches") -> tuple[int, ...] | None:
    """None (the default list), or the sorted distinct batch sizes; "" or [] = none. A string is
    a comma-separated list (the CLI's). Anything else is a ValueError naming `what`."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
        try:
            value = [int(v) for v in items]
        except ValueError:
            raise ValueError(f"{what} must be comma-separated positive integers, got {value!r}") from None
    try:
        sizes = list(value)
    except TypeError:
        raise ValueError(f"{what} must be a list of positive integers, got {value!r}") from None
    if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1 for b in sizes):
        raise ValueError(f"{what} must hold positive integers, got {sizes!r}")
    return tuple(sorted({int(b) for b in sizes}))


class CompiledGraph:
    """One compiled model and its infer request, with the metadata arrays bound to it: an input
    is rebound only when the builder handed out a new array (a steady decode step rebinds nothing)."""

    def __init__(self, compiled: ov.CompiledModel, cache_names: Sequence[str], bound_caches: Sequence[np.ndarray]):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        for name, arr in zip(cache_names, bound_caches):
            self.request.set_tensor(name, shared_tensor(arr))
        self._bound: dict[str, np.ndarray] = {}  # metadata input -> the array its tensor wraps
        self.logits = compiled.output("logits")
        outputs = {name for port in compiled.outputs for name in port.get_names()}
        self.hidden = compiled.output("hidden_states") if "hidden_states" in outputs else None

    def bind(self, feeds: dict[str, np.ndarray]) -> None:
        bound = self._bound
        for name, arr in feeds.items():
            if bound.get(name) is not arr:
                self.request.set_tensor(name, shared_tensor(arr))
                bound[name] = arr


class DecodeGraphs:
    """The static graphs of one executor, one per step shape (B sequences, T new tokens, L logits
    rows): (b, b, b) for a decode batch of b; with speculative decoding of k drafts a sequence,
    also (b, b(k + 1), b(k + 1)) for its verify steps. `table_width` tells the metadata builder the
    padded block-table width of the steps they run, `pick(feeds)` the graph of a step (or None).
    Only the shapes must match: how T tokens fall among the B sequences is the step's data."""

    def __init__(self, core: ov.Core, model: ov.Model, device: str, config: dict,
                 shapes: Sequence[tuple[int, int, int]], max_model_len: int, cache_names: Sequence[str],
                 bound_caches: Sequence[np.ndarray]):
        blocks, block_size = bound_caches[0].shape[:2]
        self.width = min(blocks, -(-max_model_len // block_size))  # no sequence holds more blocks
        self.graphs: dict[tuple[int, int, int], CompiledGraph] = {}
        caches = {name: list(arr.shape) for name, arr in zip(cache_names, bound_caches)}
        for b, t, l in shapes:  # the model is reshaped in place: the dynamic graph was compiled before
            inputs = {"input_ids": [t], "positions": [t], "slot_mapping": [t], "query_start_loc": [b + 1],
                      "seq_lens": [b], "block_tables": [b, self.width], "logits_indices": [l], **caches}
            model.reshape({name: ov.PartialShape(shape) for name, shape in inputs.items()})
            compiled = core.compile_model(model, device, {**config, **STATIC_CONFIG})
            self.graphs[(b, t, l)] = CompiledGraph(compiled, cache_names, bound_caches)
        self._steps = {(b, t) for b, t, _ in self.graphs}

    def describe(self) -> str:
        decode = [str(b) for b, t, _ in self.graphs if t == b]
        verify = [f"{b}x{t // b}" for b, t, _ in self.graphs if t != b]
        return f"static decode graphs for batch {','.join(decode)}" + (
            f" and verify steps {','.join(verify)} (sequences x tokens)" if verify else "")

    def decode_graph(self, b: int) -> CompiledGraph | None:
        """The graph of a decode batch of b (one token a sequence), if compiled."""
        return self.graphs.get((b, b, b))

    def table_width(self, num_seqs: int, num_tokens: int, needed: int) -> int:
        """The padded width for a step of a shape this object runs; `needed` for any other step."""
        return self.width if (num_seqs, num_tokens) in self._steps and needed <= self.width else needed

    def pick(self, feeds: dict[str, np.ndarray]) -> CompiledGraph | None:
        """The static graph whose input shapes are exactly this step's, or None."""
        b = feeds["seq_lens"].shape[0]
        graph = self.graphs.get((b, feeds["input_ids"].shape[0], feeds["logits_indices"].shape[0]))
        if graph is None or feeds["block_tables"].shape != (b, self.width):
            return None
        return graph


def step_shapes(batches: Sequence[int], verify_tokens: int = 0) -> list[tuple[int, int, int]]:
    """The (B, T, L) shapes of decode batches of each size in `batches`, and of their verify steps
    of `verify_tokens` tokens a sequence (1 + k drafts; 0: none)."""
    shapes = [(b, b, b) for b in batches]
    if verify_tokens > 1:
        shapes += [(b, b * verify_tokens, b * verify_tokens) for b in batches]
    return shapes
