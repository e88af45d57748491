"""One int8 MlaQLinear (default: the 102400 x 2048 lm_head) in the exported 4-row layout against the
tile16 layout, side by side in one process: both compiled, timed alternately per row count, medians.

    python tools/bench_qlinear_layout.py [--n 102400] [--k 2048] [--rows 1,2,8] [--rounds 15]

compute = bf16 (int8 activations, the runtime's mode under its bf16 hint), 2 threads. Random codes
(the speed does not depend on their values), one scale and zero point per row. Also prints how far
the two layouts' outputs are apart (the same int32 sums; only the f32 folds' order differs). Not a
test; no thresholds: the machine is shared, compare the two columns of one run.
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
from mla_export.runtime.qlinear_tiles import rows4_to_tile16  # noqa: E402


def qlinear_model(k: int, n: int, weights: list[np.ndarray], layout: str):
    names = ["w_q", "w_s", "w_zp"]
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), nm) for a, nm in zip(weights, names)]
    node = helper.make_node("MlaQLinear", ["x"] + names, ["y"], domain="mla_export", bits=8, compute="bf16",
                            layout=layout)
    graph = helper.make_graph([node], "qlinear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=102400)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rows", default="1,2,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.n % 32 or args.k % 64:
        ap.error("--n must be a multiple of 32 and --k of 64")
    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    print(f"seed 0, MlaQLinear int8 {args.n} x {args.k}, compute bf16, {args.threads} threads", flush=True)
    codes = rng.integers(0, 256, (args.n, args.k), dtype=np.uint8)
    scales = rng.random((args.n, 1), dtype=np.float32) * 0.01 + 0.001
    zps = np.full((args.n, 1), 128, np.uint8)
    core = ov_core()
    reqs = {}
    for layout in ("rows4", "tile16"):
        w = [codes if layout == "rows4" else rows4_to_tile16(codes), scales, zps]
        model = core.read_model(qlinear_model(args.k, args.n, w, layout).SerializeToString())
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                     "INFERENCE_NUM_THREADS": args.threads})
        reqs[layout] = compiled.create_infer_request()
    xs = {r: rng.standard_normal((r, args.k)).astype(np.float32) for r in rows}
    for r in rows:
        out = {lay: req.infer({"x": xs[r]})[0].copy() for lay, req in reqs.items()}
        diff = np.abs(out["rows4"] - out["tile16"]).max() / np.abs(out["rows4"]).max()
        print(f"rows {r}: layouts' outputs apart by {diff:.1e} (relative to the largest)")
    times = {(lay, r): [] for lay in reqs for r in rows}
    for _ in range(args.rounds):
        for r in rows:
            for lay, req in reqs.items():
                t = time.perf_counter()
                req.infer({"x": xs[r]})
                times[(lay, r)].append((time.perf_counter() - t) * 1e3)
    for r in rows:
        a, b = statistics.median(times[("rows4", r)]), statistics.median(times[("tile16", r)])
        print(f"rows {r}: rows4 {a:.2f} ms, tile16 {b:.2f} ms ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
