"""The MLA ops run through onnxruntime and the mla-export custom-op library (the
onnxruntime side of the numpy op front, mla_export/ops/kernels.py; the op tests and the kernel
benchmark use it directly for what only onnxruntime has).

Each call runs a one-node ONNX model (built once per signature with every dimension dynamic,
then cached) in an onnxruntime session that has `libmla_export_ort.so` registered. Inputs are
passed as they are (no dtype checks here, so the library's own validation is what reports a bad
input); bf16 arrays (ml_dtypes.bfloat16) are passed as onnx BFLOAT16 over their own memory. The
cache of `cache_write` is updated in place: a C-contiguous cache is bound without a copy (the
op writes into the caller's array); another layout goes through a contiguous copy that is
written back.

Building models needs onnx, running them only onnxruntime; never torch or openvino. Not
imported by the runtime (the executor uses ort_tensors.py).
"""

from __future__ import annotations

import threading

import numpy as np

from .. import ops
from .cache_binding import cache_binding
from .ort_tensors import (BF16, ONNX_BFLOAT16, THREADS_CONFIG_KEY, available, ortvalue,  # noqa: F401 (re-exported)
                          session_options, to_numpy)

__all__ = ["BF16", "available", "session_options", "ortvalue", "to_numpy", "single_op_model", "cache_write",
           "check_writable_cache", "THREADS_CONFIG_KEY",
           "paged_attention", "indexer_topk", "cache_write_then_attention", "FORMS"]

FORMS = {"auto": 0, "absorbed": 1, "expanded": 2}
DOMAIN = "mla_export"

_sessions: dict = {}
_lock = threading.Lock()


def _kv_attrs(cache: np.ndarray, kv_dtype: str | None) -> dict:
    """The kv_dtype attribute for this cache: omitted without kv_dtype (the op then goes by the
    element type); else the format, with 16-bit caches bound as bytes."""
    from ..formats.kv_formats import kv_dtype_of

    if kv_dtype is None:  # the op goes by the element type (u8 = bf16 bytes) and checks it
        return {}
    return {"kv_dtype": kv_dtype_of(cache, kv_dtype)}


def _bind_cache(cache: np.ndarray, attrs: dict) -> np.ndarray:
    """With a kv_dtype attribute the op reads bytes (cache_binding's rule); without it the op goes
    by the element type, so bf16/f16 arrays are passed typed."""
    return cache_binding(cache) if attrs else cache


def _onnx_type(dtype: np.dtype) -> int:
    if np.dtype(dtype) == BF16:
        return ONNX_BFLOAT16  # without importing onnx: the runtime executor uses this too
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def single_op_model(nodes: list[tuple[str, list[tuple[str, np.dtype, int]], dict, list[str]]],
                    graph_inputs: list[tuple[str, np.dtype, int]], outputs: list[tuple[str, np.dtype | None, int]]):
    """An onnx ModelProto of the given mla_export nodes, every dimension dynamic.

    nodes: (op_type, [input names], attrs, [output names]); graph_inputs / outputs:
    (name, dtype, rank) (an output dtype None is left for onnxruntime to infer)."""
    from onnx import TensorProto, helper

    def vi(name, dtype, rank):
        elem = _onnx_type(dtype) if dtype is not None else TensorProto.UNDEFINED
        return helper.make_tensor_value_info(name, elem, [f"{name}_d{i}" for i in range(rank)])

    onnx_nodes = [helper.make_node(op, ins, outs, domain=DOMAIN, **attrs) for op, ins, attrs, outs in nodes]
    graph = helper.make_graph(onnx_nodes, "mla_single_op", [vi(*g) for g in graph_inputs], [vi(*o) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return model


def _session(key, build, num_threads: int | None = None):
    import onnxruntime as ort

    with _lock:
        sess = _sessions.get(key)
        if sess is None:
            sess = ort.InferenceSession(build().SerializeToString(), sess_options=session_options(num_threads),
                                        providers=["CPUExecutionProvider"])
            _sessions[key] = sess
        return sess


def _run(op: str, given: dict, attrs: dict, num_threads: int | None = None):
    """Runs op on the given inputs (by name, put in the op's order by the op table, the ordering
    input filled in) -> its output 0. Attribute names are checked against the table, their values
    are passed as they are (the library's checks are what report a bad one)."""
    arrays = ops.ordered_inputs(op, given, filler=lambda name: np.zeros(1, np.int32))
    attrs = ops.attributes(op, attrs, check=False, require=False)
    out = ops.op(op)["outputs"][0]
    out_dtype = dict(arrays)[out["type"][1:]].dtype if out["type"].startswith("=") else _OUT_DTYPES[out["type"]]
    out_rank = ops.output_rank(op)
    if out_rank is None:
        raise ValueError(f"{op}: its output's rank follows an input's; not runnable through this front")
    key = (op, tuple((n, a.dtype.str, a.ndim) for n, a in arrays), tuple(sorted(attrs.items())), num_threads)
    sess = _session(key, lambda: single_op_model(
        [(op, [n for n, _ in arrays], attrs, ["output"])],
        [(n, a.dtype, a.ndim) for n, a in arrays], [("output", out_dtype, out_rank)]), num_threads)
    feeds = {n: ortvalue(a) for n, a in arrays}  # `arrays` keeps every buffer alive meanwhile
    return to_numpy(sess.run_with_ort_values(["output"], feeds)[0])


_OUT_DTYPES = {"i32": np.int32, "f32": np.float32}


def _contiguous(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x))


def _float_attr(x) -> float:
    return float(np.float32(x))


def check_writable_cache(kv_cache, name: str = "kv_cache") -> None:
    """A cache the library writes into must be writable memory: onnxruntime wraps the array's
    buffer without looking at numpy's flag, so a `writeable=False` array would be written behind
    numpy's back and a read-only memmap would crash the process (SIGSEGV) on the first write."""
    if not isinstance(kv_cache, np.ndarray):
        raise TypeError(f"input '{name}' must be a numpy array (it is updated in place)")
    if not kv_cache.flags.writeable:
        raise ValueError(f"input '{name}' is read-only (numpy writeable=False, e.g. a memmap opened with mode 'r'); "
                         "the cache is written in place, so it must be writable")


def cache_write(kv_c, k_pe, kv_cache: np.ndarray, slot_mapping, kv_dtype: str | None = None,
                num_threads: int | None = None) -> np.ndarray:
    """MlaCacheWrite: [kv_c[t] | k_pe[t]] -> kv_cache at slot_mapping[t] (slots < 0 skipped), in
    place. Returns kv_cache. kv_dtype (every op here): the cache's row format (kv_formats);
    None = by the array's dtype, passed as that type without the attribute."""
    check_writable_cache(kv_cache)
    target = kv_cache if kv_cache.flags.c_contiguous else np.ascontiguousarray(kv_cache)
    attrs = _kv_attrs(target, kv_dtype)
    _run("MlaCacheWrite", dict(kv_c=_contiguous(kv_c), k_pe=_contiguous(k_pe), kv_cache=_bind_cache(target, attrs),
                               slot_mapping=_contiguous(slot_mapping)), attrs, num_threads)
    if target is not kv_cache:
        kv_cache[...] = target
    return kv_cache


def paged_attention(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables,
                    scale: float, form: str | int = "auto", kv_dtype: str | None = None,
                    num_threads: int | None = None, compute: str = "f32", topk_indices=None) -> np.ndarray:
    """MlaPagedAttention: causal paged MLA over packed new tokens -> [T, H, dv].
    form: "auto", "absorbed", "expanded" (or the raw int attribute, passed unchecked); compute:
    the op's attribute (passed unchecked); topk_indices [T, K]: sparse attention (-1 = none)."""
    if isinstance(form, str):
        if form not in FORMS:
            raise ValueError(f"form must be one of {sorted(FORMS)}, got {form!r}")
        form = FORMS[form]
    q_nope = _contiguous(q_nope)
    cache = _contiguous(kv_cache)
    kv = _kv_attrs(cache, kv_dtype)
    given = dict(q_nope=q_nope, q_pe=_contiguous(q_pe), kv_cache=_bind_cache(cache, kv), w_uk=_contiguous(w_uk),
                 w_uv=_contiguous(w_uv), query_start_loc=_contiguous(query_start_loc), seq_lens=_contiguous(seq_lens),
                 block_tables=_contiguous(block_tables),
                 topk_indices=None if topk_indices is None else _contiguous(topk_indices))
    return _run("MlaPagedAttention", given, {"scale": _float_attr(scale), "form": int(form), "compute": compute, **kv},
                num_threads)


def indexer_topk(q, weights, index_cache, query_start_loc, seq_lens, block_tables, topk: int,
                 kv_dtype: str | None = None, num_threads: int | None = None, compute: str = "f32") -> np.ndarray:
    """MlaIndexerTopK -> [T, topk] int32 positions (ascending, -1 padded)."""
    cache = _contiguous(index_cache)
    kv = _kv_attrs(cache, kv_dtype)
    given = dict(q=_contiguous(q), weights=_contiguous(weights), index_cache=_bind_cache(cache, kv),
                 query_start_loc=_contiguous(query_start_loc), seq_lens=_contiguous(seq_lens),
                 block_tables=_contiguous(block_tables))
    return _run("MlaIndexerTopK", given, {"topk": int(topk), "compute": compute, **kv}, num_threads)


def cache_write_then_attention(kv_c, k_pe, slot_mapping, q_nope, q_pe, kv_cache: np.ndarray, w_uk, w_uv,
                               query_start_loc, seq_lens, block_tables, scale: float, form: str = "auto",
                               kv_dtype: str | None = None):
    """The graph pattern of a layer: MlaCacheWrite into kv_cache (in place, a C-contiguous
    numpy array), its `written` output fed to MlaPagedAttention's ordering input `after`.
    Returns (attention output, written)."""
    check_writable_cache(kv_cache)
    if not kv_cache.flags.c_contiguous:
        raise ValueError("kv_cache must be a C-contiguous numpy array (it is updated in place)")
    kv = _kv_attrs(kv_cache, kv_dtype)
    write = dict(kv_c=_contiguous(kv_c), k_pe=_contiguous(k_pe), kv_cache=_bind_cache(kv_cache, kv),
                 slot_mapping=_contiguous(slot_mapping))
    attention = dict(q_nope=_contiguous(q_nope), q_pe=_contiguous(q_pe), kv_cache=write["kv_cache"],
                     w_uk=_contiguous(w_uk), w_uv=_contiguous(w_uv), query_start_loc=_contiguous(query_start_loc),
                     seq_lens=_contiguous(seq_lens), block_tables=_contiguous(block_tables))
    arrays = list({**write, **attention}.items())  # the graph's inputs (the cache once)
    write_inputs = [v for _, v in ops.ordered_inputs("MlaCacheWrite", {n: n for n in write})]
    attention_inputs = [v for _, v in ops.ordered_inputs("MlaPagedAttention", {**{n: n for n in attention},
                                                                                  "after": "written"})]
    attrs = ops.attributes("MlaPagedAttention", {"scale": _float_attr(scale), "form": FORMS[form], **kv})
    key = ("write+attention", tuple((n, a.dtype.str, a.ndim) for n, a in arrays), tuple(sorted(attrs.items())))
    sess = _session(key, lambda: single_op_model(
        [("MlaCacheWrite", write_inputs, kv, ["written"]), ("MlaPagedAttention", attention_inputs, attrs, ["output"])],
        [(n, a.dtype, a.ndim) for n, a in arrays],
        [("output", attention["q_nope"].dtype, 3), ("written", np.int32, 1)]))
    out, written = sess.run_with_ort_values(["output", "written"], {n: ortvalue(a) for n, a in arrays})
    return to_numpy(out), int(to_numpy(written)[0])
