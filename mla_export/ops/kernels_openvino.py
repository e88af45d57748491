"""The MLA ops, each run as a one-op OpenVINO model on the CPU (the OpenVINO side of the
numpy op front, mla_export/ops/kernels.py).

A model is built and compiled once per signature (op, attributes, input dtypes) with every
dimension dynamic, then reused. Inputs are numpy arrays (bf16 as ml_dtypes.bfloat16) of any
alignment and strides: read-only inputs are made C-contiguous, and the cache of `cache_write`
is updated in place (through shared memory when it is C-contiguous, else through a contiguous
copy that is written back; bf16/f16 caches are bound as their raw bytes, see
mla_export/ops/cache_binding.py). kv_dtype (every op): the cache's row format (mla_export/formats/kv_formats.py),
by the array's dtype when None; required for quantised caches (u8 arrays). num_threads (every op):
the plugin's INFERENCE_NUM_THREADS, which the kernels split their work by (None: its default).
No torch needed.
"""

from __future__ import annotations

import threading
from xml.sax.saxutils import quoteattr

import numpy as np
import openvino as ov

from .. import ops
from .libraries import ov_core
from ..formats.kv_formats import kv_dtype_of
from .ov_op_errors import checked_infer
from .cache_binding import cache_binding
from .ov_tensors import BF16, ov_type, shared_tensor, to_numpy

__all__ = ["cache_write", "paged_attention", "indexer_topk"]

_PRECISION = {ov.Type.f32: "FP32", ov.Type.f16: "FP16", ov.Type.bf16: "BF16", ov.Type.i32: "I32", ov.Type.u8: "U8", ov.Type.i8: "I8",
              ov.Type.i64: "I64"}
_compiled: dict = {}
_lock = threading.Lock()


def _ports(rank: int) -> str:
    return "".join("<dim>-1</dim>" for _ in range(rank))


def _single_op_ir(op: str, inputs: list[tuple[str, ov.Type, int]], attrs: dict,
                  out_type: ov.Type, out_rank: int) -> str:
    """OpenVINO IR (v11) text of Parameters -> op -> Result, all dims dynamic."""
    layers, edges = [], []
    for i, (name, typ, rank) in enumerate(inputs):
        layers.append(
            f'<layer id="{i}" name="{name}" type="Parameter" version="opset1">'
            f'<data shape="{",".join(["?"] * rank)}" element_type="{typ.get_type_name()}"/>'
            f'<output><port id="0" precision="{_PRECISION[typ]}" names="{name}">{_ports(rank)}</port></output></layer>')
        edges.append(f'<edge from-layer="{i}" from-port="0" to-layer="{len(inputs)}" to-port="{i}"/>')
    n = len(inputs)
    data = " ".join(f"{k}={quoteattr(str(v))}" for k, v in attrs.items())
    in_ports = "".join(f'<port id="{i}">{_ports(rank)}</port>' for i, (_, _, rank) in enumerate(inputs))
    layers.append(
        f'<layer id="{n}" name="{op}" type="{op}" version="mla_export"><data {data}/>'
        f'<input>{in_ports}</input>'
        f'<output><port id="{n}" precision="{_PRECISION[out_type]}" names="output">{_ports(out_rank)}</port></output></layer>')
    layers.append(f'<layer id="{n + 1}" name="result" type="Result" version="opset1">'
                  f'<input><port id="0">{_ports(out_rank)}</port></input></layer>')
    edges.append(f'<edge from-layer="{n}" from-port="{n}" to-layer="{n + 1}" to-port="0"/>')
    return (f'<?xml version="1.0"?><net name="{op}" version="11"><layers>{"".join(layers)}</layers>'
            f'<edges>{"".join(edges)}</edges></net>')


def _request(op: str, arrays: list[tuple[str, np.ndarray]], attrs: dict, out_type: ov.Type, out_rank: int,
             num_threads: int | None):
    sig = (op, tuple((n, a.dtype.str, a.ndim) for n, a in arrays), tuple(sorted(attrs.items())), num_threads)
    with _lock:
        if sig not in _compiled:
            xml = _single_op_ir(op, [(n, ov_type(a.dtype), a.ndim) for n, a in arrays], attrs, out_type, out_rank)
            core = ov_core()
            model = core.read_model(model=xml, weights=ov.Tensor(ov.Type.u8, [0]))
            config = {"INFERENCE_PRECISION_HINT": "f32"}
            if num_threads is not None:  # the kernels split work (and merge splits) by the plugin's threads
                config["INFERENCE_NUM_THREADS"] = _threads(num_threads)
            compiled = core.compile_model(model, "CPU", config)
            _compiled[sig] = compiled
        return _compiled[sig].create_infer_request()


def _threads(num_threads) -> int:
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
    return int(num_threads)


def _run(op: str, given: dict, attrs: dict, num_threads: int | None = None):
    """Runs op on the given inputs (by name; put in the op's order, each converted by its type
    class, the ordering input filled in) -> its output 0 as a tensor. The output's type and rank
    come from the op table."""
    arrays = ops.ordered_inputs(op, given, filler=lambda name: np.zeros(1, np.int32))
    arrays = [(n, _BIND[cls](n, a)) for (n, a), cls in zip(arrays, (i["type"] for i in ops.op(op)["inputs"]))]
    out = ops.op(op)["outputs"][0]
    out_type = ov_type(dict(arrays)[out["type"][1:]].dtype) if out["type"].startswith("=") else _OUT_TYPES[out["type"]]
    attrs = ops.attributes(op, attrs)
    req = _request(op, arrays, attrs, out_type, ops.output_rank(op), num_threads)
    tensors = [shared_tensor(a) for _, a in arrays]  # `arrays` keeps every buffer alive meanwhile
    for i, t in enumerate(tensors):
        req.set_input_tensor(i, t)
    checked_infer(req)
    return req.get_output_tensor(0)


def _float(name: str, x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype not in (np.float32, np.float16, BF16):
        raise TypeError(f"input '{name}' must be float32, float16 or bfloat16, got {a.dtype}")
    return np.ascontiguousarray(a)


def _index(name: str, x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype not in (np.int32, np.int64):
        raise TypeError(f"input '{name}' must be int32 or int64, got {a.dtype}")
    # Indices past int32 are refused here already (the graph's index inputs are int32); the ops
    # themselves also read an i64 input as given, past the CPU plugin's narrowing Convert
    # (read_i64_indices in mla_ops.cpp), so a large value is never wrapped.
    if a.dtype == np.int64 and a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        raise ValueError(f"input '{name}' holds a value outside the int32 range")
    return np.ascontiguousarray(a)


def _cache(kv_cache, kv_dtype: str | None) -> tuple[np.ndarray, str]:
    """The cache array (C-contiguous) and its format."""
    a = np.asarray(kv_cache)
    try:
        fmt = kv_dtype_of(a, kv_dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"input 'kv_cache': {e}") from None
    return np.ascontiguousarray(a), fmt


# How an input of each type class of the op table is passed (caches: as cache_binding made them).
_BIND = {"float": _float, "index": _index, "cache": lambda name, a: a, "any": lambda name, a: np.ascontiguousarray(a)}
_OUT_TYPES = {"i32": ov.Type.i32, "f32": ov.Type.f32}


def cache_write(kv_c, k_pe, kv_cache: np.ndarray, slot_mapping, kv_dtype: str | None = None,
                num_threads: int | None = None) -> np.ndarray:
    """Write [kv_c[t] | k_pe[t]] into kv_cache at slot_mapping[t] (skipping slots < 0), in place.

    kv_cache [NB, BS, r + dr] float32, bfloat16 or float16, or u8 [NB, BS, row bytes] for
    kv_dtype a quantised format; returns kv_cache."""
    if not isinstance(kv_cache, np.ndarray):
        raise TypeError("input 'kv_cache' must be a numpy array (updated in place)")
    _, fmt = _cache(kv_cache, kv_dtype)
    target = kv_cache if kv_cache.flags.c_contiguous else np.ascontiguousarray(kv_cache)
    _run("MlaCacheWrite", dict(kv_c=kv_c, k_pe=k_pe, kv_cache=cache_binding(target), slot_mapping=slot_mapping),
         {"kv_dtype": fmt}, num_threads)
    if target is not kv_cache:
        kv_cache[...] = target
    return kv_cache


def paged_attention(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables,
                    scale: float, form: str = "auto", kv_dtype: str | None = None,
                    num_threads: int | None = None, compute: str = "f32", topk_indices=None) -> np.ndarray:
    """Causal paged MLA over packed new tokens: -> [T, H, dv].

    form: "auto" (per sequence by cost), "absorbed" or "expanded"; compute: the op's attribute;
    topk_indices [T, K]: sparse attention over each token's listed positions (-1 = none)."""
    forms = {"auto": 0, "absorbed": 1, "expanded": 2}
    if form not in forms:
        raise ValueError(f"form must be one of {sorted(forms)}, got {form!r}")
    cache, fmt = _cache(kv_cache, kv_dtype)
    out = _run("MlaPagedAttention",
               dict(q_nope=q_nope, q_pe=q_pe, kv_cache=cache_binding(cache), w_uk=w_uk, w_uv=w_uv,
                    query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
                    topk_indices=topk_indices),
               {"scale": scale, "form": forms[form], "kv_dtype": fmt, "compute": compute}, num_threads)
    return to_numpy(out)


def indexer_topk(q, weights, index_cache, query_start_loc, seq_lens, block_tables, topk: int,
                 kv_dtype: str | None = None, num_threads: int | None = None, compute: str = "f32") -> np.ndarray:
    """MlaIndexerTopK: DeepSeek Sparse Attention's indexer over the paged key cache -> [T, topk]
    int32 positions (ascending; -1 pads a token that sees fewer than topk positions)."""
    cache, fmt = _cache(index_cache, kv_dtype)
    out = _run("MlaIndexerTopK",
               dict(q=q, weights=weights, index_cache=cache_binding(cache), query_start_loc=query_start_loc,
                    seq_lens=seq_lens, block_tables=block_tables),
               {"topk": int(topk), "kv_dtype": fmt, "compute": compute}, num_threads)
    return to_numpy(out)
