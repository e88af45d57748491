"""onnxruntime columns for the kernel benchmark: the MLA ops through the portable ONNX functions
(model-local functions of standard ops, `mla_export.portable` domain, no custom-op library), to
set beside `bench_impls.ort_decode` / `ort_prefill` (the custom-op library).

    from ort_bench_ops import ort_portable_decode, ort_portable_prefill   # -> bench_impls.Impl
    python tools/ort_bench_ops.py      # one small decode and prefill case, both ORT paths, checked

The portable graph has no decode op: a decode case runs the portable attention with one new
token per sequence and identity W_UK / W_UV (so q_nope @ W_UK = the latent query and the output
is the latent o [B, H, r]); the two identity matmuls add 4 * B * H * r^2 FLOP, small next to the
context. Each builder returns an Impl (`times(n)`, `output()` as float32) and raises
`bench_impls.Skip` when the portable path cannot run a case here (its [T, H, B*L] score tensor
would be too big). bf16 cases run with f32 activations and weights over the bf16 cache (the
portable graphs' own layout: onnxruntime's CPU ops lack bf16).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_impls as bi  # noqa: E402

__all__ = ["ort_portable_decode", "ort_portable_prefill"]

_MAX_SCORES_BYTES = 2e9


def _portable_session(inp: dict, scale: float, threads: int):
    import onnxruntime as ort

    from mla_export.ops import onnx_ops
    from mla_export.ops import kernels_onnxruntime as ok

    names = bi.PREFILL_INPUTS
    model = ok.single_op_model([], [(n, inp[n].dtype, inp[n].ndim) for n in names],
                               [("output", inp["q_nope"].dtype, 3)])
    model.graph.node.append(onnx_ops.portable_attention_node(*names, out="output", name="attention", scale=scale))
    del model.opset_import[:]
    model.opset_import.extend(onnx_ops.opset_imports(portable=True))
    model.functions.extend(onnx_ops.portable_functions())
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])


def _impl(inp: dict, scale: float, threads: int) -> bi.Impl:
    from mla_export.ops import kernels_onnxruntime as ok

    t = inp["q_nope"].shape[0]
    h = inp["q_nope"].shape[1]
    b = inp["seq_lens"].shape[0]
    ctx = inp["block_tables"].shape[1] * inp["kv_cache"].shape[1]
    scores = 4.0 * t * h * b * ctx
    if scores > _MAX_SCORES_BYTES:
        raise bi.Skip(f"portable attention would hold {scores / 1e9:.1f} GB of scores")
    # onnxruntime's CPU kernels lack bf16 for several standard ops the function uses (Where,
    # Softmax, MatMul): as in an exported portable graph, activations and weights run in f32 and
    # only the cache stays bf16 (the function casts its rows).
    inp = {n: (a.astype(np.float32) if n != "kv_cache" and a.dtype == bi.BF16 else a) for n, a in inp.items()}
    sess = _portable_session(inp, scale, threads)
    arrays = {n: np.ascontiguousarray(inp[n]) for n in bi.PREFILL_INPUTS}
    feeds = {n: ok.ortvalue(a) for n, a in arrays.items()}

    def run():
        _ = arrays  # keep the bound buffers alive
        return sess.run_with_ort_values(["output"], feeds)[0]
    return bi.local_impl(run, ok.to_numpy)


def ort_portable_prefill(inp: dict, scale: float, threads: int) -> bi.Impl:
    """MlaPagedAttention through the portable function (inputs of bench_impls.prefill_inputs)."""
    return _impl(inp, scale, threads)


def ort_portable_decode(inp: dict, scale: float, threads: int) -> bi.Impl:
    """Absorbed decode's math through the portable attention (inputs of bench_impls.decode_inputs)."""
    as_prefill = bi.decode_form_inputs(inp)  # MlaPagedAttention's decode form (q split at r, identity w_uk/w_uv)
    return _impl(as_prefill, scale, threads)


def main() -> int:
    import statistics

    from mla_export.ops import reference as ref

    rng = np.random.default_rng(0)
    threads = 2
    dec = bi.decode_inputs(rng, 2, 16, 512, 16, "bf16")
    pre = bi.prefill_inputs(rng, 64, 192, 16, 16, "f32")
    scale = (bi.DN + bi.DR) ** -0.5
    want_dec = ref.paged_decode(*[dec[n] for n in bi.DECODE_INPUTS], scale, bi.R)
    want_pre = ref.paged_attention_absorbed(*[pre[n] for n in bi.PREFILL_INPUTS], scale)
    for label, impls, want in [
        ("decode B2 H16 ctx512 bs16 bf16", {"ort": bi.ort_decode(dec, scale, threads),
                                            "ort-portable": ort_portable_decode(dec, scale, threads)}, want_dec),
        ("prefill new64 prefix192 H16 bs16 f32", {"ort": bi.ort_prefill(pre, scale, threads),
                                                  "ort-portable": ort_portable_prefill(pre, scale, threads)}, want_pre),
    ]:
        for name, impl in impls.items():
            out = impl.output()
            err = float(np.abs(out - want).max() / np.abs(want).max())
            ms = statistics.median(impl.times(20)[3:]) * 1e3
            print(f"{label:40s} {name:13s} {ms:8.3f} ms  rel err {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
