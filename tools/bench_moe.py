"""One MoE layer (router + routed experts, no shared experts) at chosen dims, timed per form.

Each form's graph is made by the exporter's own code (mla_export/export/moe.py) from seeded random
weights, except `legacy`: the form exports had before (64 NonZero/Gather/3 Gemm/ScatterND chains),
kept here as the baseline. All requested forms are compiled once and timed side by side,
alternating form by form for each token count (medians of the rounds); exactness is checked at
f32 against a float64 numpy evaluation of the routed MoE (max relative error).

  python tools/bench_moe.py --forms legacy,grouped,gather_matmul --tokens 1,8,1024 --weights int8
  python tools/bench_moe.py --forms grouped,fused --tokens 1,8,1024 --weights int4 --precision bf16
  python tools/bench_moe.py --runtime onnxruntime --forms legacy,grouped --tokens 1,1024

--weights int8 / int4 compress the experts with NNCF's data-free compress_weights (INT8_ASYM per
output channel, INT4_ASYM group 128; `pip install nncf==3.4.*`, not a project dependency).
Memory: every form holds its own copy of the layer's weights (f32 at V2-Lite dims: 2.2 GB each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_export.checkpoint.config import MLAModelConfig  # noqa: E402
from mla_export.export.graph import GraphBuilder, WeightFormat, WeightStore  # noqa: E402
from mla_export.export.moe import router  # noqa: E402

ROUTING = {  # transformers' DeepSeek configs (V2-Lite: greedy softmax; V3: sigmoid + bias + groups)
    "v2": dict(model_type="deepseek_v2", topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
               norm_topk_prob=False),
    "v3": dict(model_type="deepseek_v3", n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True),
}


class SeededExperts:
    """A checkpoint reader over seeded random tensors (each made on demand from its name, so the
    forms see identical weights and nothing is held between calls)."""

    def __init__(self, cfg: MLAModelConfig, seed: int):
        self.cfg, self.seed = cfg, seed

    def has(self, name: str) -> bool:
        return ".experts." in name or name.endswith(("gate.weight", "e_score_correction_bias"))

    def get(self, name: str, shape=None) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if name.endswith("e_score_correction_bias"):
            return (rng.standard_normal(shape, dtype=np.float32) * 0.01).astype(np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)


def make_cfg(hidden: int, n_exp: int, inter: int, k: int, routing: str) -> MLAModelConfig:
    r = dict(ROUTING[routing])
    raw = dict(architectures=["DeepseekV3ForCausalLM" if routing == "v3" else "DeepseekV2ForCausalLM"],
               hidden_size=hidden, n_routed_experts=n_exp, moe_intermediate_size=inter, num_experts_per_tok=k,
               n_shared_experts=0, first_k_dense_replace=0, num_hidden_layers=1, num_attention_heads=16,
               kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=None,
               vocab_size=1000, intermediate_size=inter, max_position_embeddings=4096, rms_norm_eps=1e-6,
               rope_theta=10000.0, **r)
    return MLAModelConfig.from_dict(raw)


def legacy_experts(g: GraphBuilder, rd, cfg: MLAModelConfig, x: str, weights: str, idx: str) -> str:
    """The routed experts as exports wrote them before the grouped form (the baseline)."""
    from onnx import TensorProto, helper

    hidden, inter, n_exp = cfg.hidden_size, cfg.moe.moe_intermediate_size, cfg.moe.n_routed_experts
    out = g.op("ConstantOfShape", g.op("Shape", x), value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]))
    for e in range(n_exp):
        ep = f"model.layers.0.mlp.experts.{e}"
        hit = g.op("NonZero", g.op("Equal", idx, g.i64(e)))
        tokens = g.op("Gather", hit, g.i64(0), axis=0)
        coef = g.op("GatherND", weights, g.op("Transpose", hit, perm=[1, 0]))
        xe = g.op("Gather", x, g.op("Squeeze", tokens, g.i64(0)), axis=0)
        gate = g.op("Gemm", xe, g.weight(f"{ep}.gate_proj.weight", rd.get(f"{ep}.gate_proj.weight", (inter, hidden))), transB=1)
        up = g.op("Gemm", xe, g.weight(f"{ep}.up_proj.weight", rd.get(f"{ep}.up_proj.weight", (inter, hidden))), transB=1)
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        y = g.op("Gemm", act, g.weight(f"{ep}.down_proj.weight", rd.get(f"{ep}.down_proj.weight", (hidden, inter))), transB=1)
        y = g.op("Mul", y, g.op("Unsqueeze", coef, g.i64(1)))
        out = g.op("ScatterND", out, g.op("Transpose", tokens, perm=[1, 0]), y, reduction="add")
    return out


def build(form: str, cfg: MLAModelConfig, rd, out_dir: Path, weights: str = "f32") -> Path:
    """A one-layer ONNX graph x [T, hidden] -> routed MoE output [T, hidden]."""
    import onnx
    from onnx import TensorProto, helper

    from mla_export.export import moe as moe_mod

    # int8/int4: the exporter's own quantizer (per channel / group 128), the same codes for every form
    store = WeightStore(out_dir / f"{form}.onnx.data", WeightFormat(weights, group_size=128))
    try:
        g = GraphBuilder(store, ["custom"])
        prefix = "model.layers.0.mlp"
        if form == "legacy":
            weights, idx = router(g, rd, cfg, prefix, "x")
            y = legacy_experts(g, rd, cfg, "x", weights, idx)
        else:
            y = moe_mod.moe(g, rd, cfg, 0, "x", {"custom": form})
        g.op("Identity", y, name="y")
    finally:
        store.close()
    hidden = cfg.hidden_size
    graph = helper.make_graph(g.variants["custom"], f"moe_{form}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", hidden])], store.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("mla_export", 1)],
                              ir_version=10)
    path = out_dir / f"{form}.onnx"
    onnx.save_model(model, str(path))
    return path


def reference(cfg: MLAModelConfig, rd, xs: np.ndarray) -> np.ndarray:
    """float64 routed MoE, transformers' routing (the configs here have no group-limited V2 routing)."""
    m, n_exp, k = cfg.moe, cfg.moe.n_routed_experts, cfg.moe.num_experts_per_tok
    p = "model.layers.0.mlp"
    logits = xs.astype(np.float64) @ rd.get(f"{p}.gate.weight", (n_exp, cfg.hidden_size)).T.astype(np.float64)
    if m.scoring == "sigmoid":
        s = 1 / (1 + np.exp(-logits))
        choice = s + rd.get(f"{p}.gate.e_score_correction_bias", (n_exp,))
        gsz = n_exp // m.n_group
        gscore = np.sort(choice.reshape(len(xs), m.n_group, gsz), -1)[..., -2:].sum(-1)
        keep = np.zeros_like(gscore)
        np.put_along_axis(keep, np.argsort(-gscore, -1, kind="stable")[:, :m.topk_group], 1, -1)
        choice = np.where(np.repeat(keep, gsz, -1) > 0, choice, -np.inf)
        idx = np.argsort(-choice, -1, kind="stable")[:, :k]
        w = np.take_along_axis(s, idx, -1)
        if m.norm_topk_prob:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
    else:
        s = np.exp(logits - logits.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        idx = np.argsort(-s, -1, kind="stable")[:, :k]
        w = np.take_along_axis(s, idx, -1)
    w = w * m.routed_scaling_factor
    out = np.zeros((len(xs), cfg.hidden_size))
    h, i = cfg.hidden_size, m.moe_intermediate_size
    for e in np.unique(idx):
        ep = f"{p}.experts.{e}"
        t, j = np.nonzero(idx == e)
        xe = xs[t].astype(np.float64)
        gate = xe @ rd.get(f"{ep}.gate_proj.weight", (i, h)).T.astype(np.float64)
        up = xe @ rd.get(f"{ep}.up_proj.weight", (i, h)).T.astype(np.float64)
        y = (gate / (1 + np.exp(-gate)) * up) @ rd.get(f"{ep}.down_proj.weight", (h, i)).T.astype(np.float64)
        np.add.at(out, t, y * w[t, j][:, None])
    return out


def compile_openvino(path: Path, threads: int, precision: str):
    from mla_export import ov_core
    from mla_export.export.openvino_ir import _fold_weight_transposes
    from mla_export.runtime.executor_openvino import match_moe_compute

    core = ov_core()  # with our extension (the fused form's op)
    model = core.read_model(str(path))
    _fold_weight_transposes(model)
    match_moe_compute(model, precision)
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads}
    if precision == "f32":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0  # as the runtime's f32 mode
    compiled = core.compile_model(model, "CPU", config)
    types = {}
    for op in compiled.get_runtime_model().get_ops():
        t = op.get_rt_info()["layerType"].astype(str)
        types[t] = types.get(t, 0) + 1
    request = compiled.create_infer_request()
    return (lambda x: request.infer({0: x})[0]), {t: types[t] for t in ("GatherMatmul", "FullyConnected", "NonZero",
                                                                        "ScatterNDUpdate", "Reference") if t in types}


def compile_onnxruntime(path: Path, threads: int, precision: str):
    import onnxruntime as ort

    from mla_export import ort_ops_path

    if precision != "f32":
        raise SystemExit("--runtime onnxruntime computes f32 only (--precision f32)")
    opts = ort.SessionOptions()
    if ort_ops_path():
        opts.register_custom_ops_library(ort_ops_path())
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return (lambda x: sess.run(None, {"x": x})[0]), {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", default="legacy,grouped,gather_matmul")
    ap.add_argument("--routing", choices=sorted(ROUTING), default="v2")
    ap.add_argument("--dims", default="2048,64,1408,6", help="hidden,experts,moe_intermediate,top_k (V2-Lite)")
    ap.add_argument("--tokens", default="1,8,1024")
    ap.add_argument("--weights", choices=("f32", "int8", "int4"), default="f32")
    ap.add_argument("--runtime", choices=("openvino", "onnxruntime"), default="openvino")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                    help="OpenVINO's inference precision (bf16: the runtime's default where the CPU has it)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7, help="timed runs per form and token count (median)")
    ap.add_argument("--seed", type=int, default=20261203)
    args = ap.parse_args()
    hidden, n_exp, inter, k = (int(v) for v in args.dims.split(","))
    cfg = make_cfg(hidden, n_exp, inter, k, args.routing)
    rd = SeededExperts(cfg, args.seed)
    forms = args.forms.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    print(f"[bench_moe] seed {args.seed}, {args.routing} routing, dims {args.dims}, weights {args.weights}, "
          f"{args.runtime} {args.precision}, {args.threads} threads", file=sys.stderr)
    runners, result = {}, dict(routing=args.routing, dims=args.dims, weights=args.weights, runtime=args.runtime,
                               precision=args.precision, threads=args.threads, forms={})
    x_check = np.random.default_rng(args.seed).standard_normal((32, hidden), dtype=np.float32)
    ref = reference(cfg, rd, x_check) if args.weights == "f32" and args.precision == "f32" else None
    with tempfile.TemporaryDirectory(prefix="bench-moe-") as tmp:
        for form in forms:
            path = build(form, cfg, rd, Path(tmp), args.weights)
            run, types = (compile_openvino if args.runtime == "openvino" else compile_onnxruntime)(
                path, args.threads, args.precision)
            runners[form] = run
            info = dict(nodes=types, ms={})
            if ref is not None:
                info["max_rel_err_f32"] = float(np.abs(run(x_check) - ref).max() / np.abs(ref).max())
            result["forms"][form] = info
        for t in tokens:
            x = np.random.default_rng(t).standard_normal((t, hidden), dtype=np.float32)
            for form in forms:
                runners[form](x)  # warm-up (shape-dependent preparation)
            times = {f: [] for f in forms}
            for _ in range(args.rounds):
                for form in forms:  # A B C A B C ...
                    t0 = time.perf_counter()
                    runners[form](x)
                    times[form].append((time.perf_counter() - t0) * 1e3)
            for form in forms:
                result["forms"][form]["ms"][t] = round(statistics.median(times[form]), 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
