"""One MlaQLinear (default: the 102400 x 2048 lm_head, int8), or one MoE layer's MlaMoeExperts
(--op moe: V2-Lite's 64 experts of 2048 -> 1408, top-6), in the exported 4-row layout against the
tile16 layout, side by side in one process: both compiled, timed alternately per row count, medians.

    python tools/bench_qlinear_layout.py [--n 102400] [--k 2048] [--rows 1,2,8] [--rounds 15]
    python tools/bench_qlinear_layout.py --op moe [--k 2048] [--inter 1408] [--experts 64] [--topk 6] --rows 1,8,1024
    ... [--format fp8]   # e4m3 codes, a scale per 128 inputs (an FP8 checkpoint's), on bf16 rows
    ... [--format int4]  # int4 codes, a scale and zero point per 128 inputs (the int4 export's default)

compute = bf16 (int8 activations, the runtime's mode under its bf16 hint), 2 threads. Random codes
(the speed does not depend on their values), one scale and zero point per row; the MoE's tokens
routed to random distinct experts (rows = tokens). Also prints how far the two layouts' outputs are
apart (the same int32 sums; only the f32 folds' order differs), and for 1-8 rows the weight bytes
a call reads (the MoE: its tokens' experts) over its time, as a share of a plain 2-thread read
measured before and after the timed rounds (mla_export/bench/bandwidth.py): a floor, since a call's
time includes OpenVINO's own per-call work (0.2-0.35 ms here for one MoE call, against the op's ~1.0
ms at 1 int4 token, timed inside it). Not a test; no thresholds: the machine is shared, compare the
two columns of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_export import ov_core  # noqa: E402
from mla_export.bench.bandwidth import read_gbps  # noqa: E402
from mla_export.runtime.qlinear_tiles import to_tile16  # noqa: E402


FP8_BITS = 43


def qlinear_model(k: int, n: int, weights: list[np.ndarray], layout: str, bits: int = 8):
    names = ["w_q", "w_s", "w_zp"]
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), nm) for a, nm in zip(weights, names)]
    node = helper.make_node("MlaQLinear", ["x"] + names, ["y"], domain="mla_export", bits=bits, compute="bf16",
                            layout=layout)
    graph = helper.make_graph([node], "qlinear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


def moe_model(k: int, inter: int, weights: list[np.ndarray], layout: str, bits: int = 8):
    names = ["w13_q", "w13_s", "w13_zp", "w2_q", "w2_s", "w2_zp"]
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), nm) for a, nm in zip(weights, names)]
    node = helper.make_node("MlaMoeExperts", ["x", "ids", "wts"] + names, ["y"], domain="mla_export", w13_bits=bits,
                            w2_bits=bits, compute="bf16", layout=layout)
    graph = helper.make_graph(
        [node], "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k]),
                        helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None]),
                        helper.make_tensor_value_info("wts", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, k])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


def _codes(rng, shape, fmt: str = "int8"):
    """Random int8 codes [..., rows, k] (4-row layout), per-row scales and zero points; fp8: e4m3
    codes (no NaN), a scale per 128 inputs, zero points 0; int4: two codes a byte, a scale and zero
    point per 128 inputs."""
    if fmt == "int4":
        groups = shape[:-1] + (shape[-1] // 128,)
        codes = rng.integers(0, 256, shape[:-1] + (shape[-1] // 2,), dtype=np.uint8)
        return codes, rng.random(groups, dtype=np.float32) * 0.01 + 0.001, np.full(groups, 8, np.uint8)
    if fmt == "fp8":
        groups = shape[:-1] + (shape[-1] // 128,)
        codes = rng.integers(0, 256, shape, dtype=np.uint8) & 0xF7  # 0x7F / 0xFF are NaN
        return codes, rng.random(groups, dtype=np.float32) * 0.01 + 0.001, np.zeros(groups, np.uint8)
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    scales = rng.random(shape[:-1] + (1,), dtype=np.float32) * 0.01 + 0.001
    return codes, scales, np.full(shape[:-1] + (1,), 128, np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", choices=["qlinear", "moe"], default="qlinear")
    ap.add_argument("--n", type=int, default=102400)
    ap.add_argument("--inter", type=int, default=1408, help="--op moe: an expert's intermediate size")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--format", choices=["int8", "int4", "fp8"], default="int8")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rows", default="1,2,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.n % 32 or args.k % 128 or args.inter % 128 or not 0 < args.topk <= args.experts:
        ap.error("--n must be a multiple of 32, --k and --inter of 128; 0 < --topk <= --experts")
    fmt = args.format
    bits = {"int8": 8, "int4": 4, "fp8": FP8_BITS}[fmt]
    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    core = ov_core()
    reqs = {}
    if args.op == "qlinear":
        print(f"seed 0, MlaQLinear {args.format} {args.n} x {args.k}, compute bf16, {args.threads} threads", flush=True)
        codes, scales, zps = _codes(rng, (args.n, args.k), fmt)
        ops = {"rows4": [codes, scales, zps], "tile16": list(to_tile16(codes, scales, zps))}
        models = {lay: qlinear_model(args.k, args.n, ops[lay], lay, bits) for lay in ops}
        feeds = {r: {"x": rng.standard_normal((r, args.k)).astype(np.float32)} for r in rows}
    else:
        print(f"seed 0, MlaMoeExperts {args.format}, {args.experts} experts {args.k} -> {args.inter}, "
              f"top-{args.topk}, compute bf16, {args.threads} threads", flush=True)
        w13 = _codes(rng, (args.experts, 2 * args.inter, args.k), fmt)
        w2 = _codes(rng, (args.experts, args.k, args.inter), fmt)
        ops = {"rows4": [*w13, *w2], "tile16": [*to_tile16(*w13), *to_tile16(*w2)]}
        models = {lay: moe_model(args.k, args.inter, ops[lay], lay, bits) for lay in ops}
        feeds = {r: {"x": rng.standard_normal((r, args.k)).astype(np.float32),
                     "ids": np.stack([rng.permutation(args.experts)[:args.topk] for _ in range(r)]).astype(np.int64),
                     "wts": rng.random((r, args.topk), dtype=np.float32)} for r in rows}
    for layout, m in models.items():
        compiled = core.compile_model(core.read_model(m.SerializeToString()), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": args.threads})
        reqs[layout] = compiled.create_infer_request()
    for r in rows:
        out = {lay: req.infer(feeds[r])[0].copy() for lay, req in reqs.items()}
        diff = np.abs(out["rows4"] - out["tile16"]).max() / np.abs(out["rows4"]).max()
        print(f"rows {r}: layouts' outputs apart by {diff:.1e} (relative to the largest)")
    weight_bytes = {}  # the bytes a call at r rows reads: every weight (MlaQLinear), its tokens' experts (MoE)
    for r in rows:
        arrays = [a for a in ops["rows4"] if a.ndim >= 2]
        per_matrix = sum(a.nbytes for a in arrays)
        if args.op == "moe":
            per_matrix = per_matrix * len(np.unique(feeds[r]["ids"])) // args.experts
        weight_bytes[r] = per_matrix
    read_before = read_gbps(args.threads)
    times = {(lay, r): [] for lay in reqs for r in rows}
    for _ in range(args.rounds):
        for r in rows:
            for lay, req in reqs.items():
                t = time.perf_counter()
                req.infer(feeds[r])
                times[(lay, r)].append((time.perf_counter() - t) * 1e3)
    read = (read_before + read_gbps(args.threads)) / 2
    print(f"plain {args.threads}-thread read: {read:.1f} GB/s (mean of before and after)")
    for r in rows:
        a, b = statistics.median(times[("rows4", r)]), statistics.median(times[("tile16", r)])
        share = ""
        if r <= 8:
            gbs = [weight_bytes[r] / (t * 1e6) for t in (a, b)]
            share = f"; weights {gbs[0]:.1f} / {gbs[1]:.1f} GB/s = {gbs[0] / read:.2f} / {gbs[1] / read:.2f} of the read"
        print(f"rows {r}: rows4 {a:.2f} ms, tile16 {b:.2f} ms ({a / b:.2f}x){share}")


if __name__ == "__main__":
    main()
