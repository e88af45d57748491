"""The routed-experts block (DeepSeek MoE) as ONNX nodes, in one of three forms.

Routing is transformers 5.24's (`_router`): DeepseekV2 softmax, greedy or group-limited greedy,
and DeepseekV3 sigmoid + e_score_correction_bias + group mask + norm_topk_prob, both times
routed_scaling_factor. The experts then run in one of two forms:

"grouped" (the default for every output): the T*k (token, slot) pairs are sorted by expert once
(TopK on the expert ids), the chosen tokens' rows are gathered in that order and cut into 64
pieces by ONE Split whose lengths are the per-expert counts; each expert runs its own
`gate_up` Gemm on its rows only (empty for most experts in decode), SiLU-and-multiply and its
`down` Gemm; the 64 outputs are concatenated, weighed and added back onto their tokens by one
ScatterND(add). The additions reach each token in ascending expert order, as transformers'
expert loop adds them. Weights are per-expert 2-D [out, in] tensors (one `g.weight` call per
expert and projection), so each expert's Gemm reads its own constant (a compressed one stays a
Const -> Convert -> Subtract -> Multiply chain in front of one MatMul).

"fused" (the default for int8/int4 weights): one MlaMoeExperts node of our extension per layer
(custom_ops/kernels/moe_experts.hpp), in both the IR and model.onnx. It reads only the selected
experts' integer codes, dequantising in registers (decode: one pass over 6 experts' weights and no
per-expert node, shape inference or primitive lookup at all), and for experts with many tokens
(prefill) dequantises a panel of rows once and reuses it. Its weights are stacked per projection,
w13 = [gate; up] [E, 2I, hidden] and w2 = down [E, hidden, I], in the op's own layout (quantize.py:
moe_operands). The portable ONNX, made of standard ops only, keeps the grouped form with its own
copy of the expert weights.

"gather_matmul": the vectorized-experts pattern OpenVINO's MoE passes match
(ConvertTiledMoeBlockTo3GatherMatmuls): x tiled to [E, T, hidden], batched MatMuls with the
stacked weights [E, out, in] (transpose_b), routing weights scattered into [T, E], transposed to
[E, T, 1], ReduceSum over experts. The CPU plugin turns it into three GatherMatmul nodes that
compute the selected experts only. On this machine (AVX-512 without AMX) GatherMatmul runs one
GEMV per (token, expert) pair and is far slower than the grouped form from T = 8 tokens on (see
docs/ARCHITECTURE.md, "MoE"); it is kept as an export option for CPUs with AMX, where the plugin
batches each expert's tokens into one GEMM. onnxruntime would compute every expert densely from
that graph, so ONNX outputs always use the grouped form.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..checkpoint.config import MLAModelConfig
from .graph import GraphBuilder, WeightFormat, _int4_error
from .quantize import CODE_FORMATS, FP8_BITS, fp8_group, fp8_operands, moe_operands, pick_group, quantize
from ..checkpoint.reader import CheckpointReader

__all__ = ["MOE_FORMS", "moe", "router", "fused_form_problem"]

MOE_FORMS = ("grouped", "gather_matmul", "fused")


def _f32_value(v: float):
    return helper.make_tensor("value", TensorProto.FLOAT, [1], [v])


def _group_mask(g: GraphBuilder, scores: str, n_exp: int, n_group: int, topk_group: int, group_score: str) -> str:
    """[T, E] bool: experts of the topk_group best groups (group score = top-2 sum for V3, max for V2)."""
    grouped = g.op("Reshape", scores, g.i64(-1, n_group, n_exp // n_group))
    if group_score == "top2_sum":
        top2 = g.op("TopK", grouped, g.i64(2), axis=-1, n_out=2)[0]
        gscore = g.op("ReduceSum", top2, g.i64(-1), keepdims=0)
    else:
        gscore = g.op("ReduceMax", grouped, g.i64(-1), keepdims=0)
    gidx = g.op("TopK", gscore, g.i64(topk_group), axis=-1, n_out=2)[1]  # [T, topk_group]
    ones = g.op("ConstantOfShape", g.op("Shape", gidx), value=_f32_value(1.0))
    zeros = g.op("ConstantOfShape", g.op("Shape", gscore), value=_f32_value(0.0))
    gmask = g.op("ScatterElements", zeros, gidx, ones, axis=1)  # [T, G]
    emask = g.op("Expand", g.op("Unsqueeze", gmask, g.i64(-1)), g.i64(1, 1, n_exp // n_group))
    return g.op("Cast", g.op("Reshape", emask, g.i64(-1, n_exp)), to=TensorProto.BOOL)


def router(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, prefix: str, x: str) -> tuple[str, str]:
    """(topk_weights [T, k] f32, topk_indices [T, k] i64) exactly as the model's TopkRouter."""
    moe, n_exp = cfg.moe, cfg.moe.n_routed_experts
    k = g.i64(moe.num_experts_per_tok)
    if moe.topk_method == "zero_experts":  # LongcatFlashTopkRouter: softmax over real + identity experts
        n_all = n_exp + moe.zero_experts
        name = f"{prefix}.router.classifier.weight"  # its bias, if any, is not read by transformers' forward
        scores = g.op("Softmax", g.op("Gemm", x, g.f32_tensor(name, rd.get(name, (n_all, cfg.hidden_size))),
                                      transB=1), axis=-1)
        bias = f"{prefix}.router.e_score_correction_bias"
        choice = g.op("Add", scores, g.f32_tensor(bias, rd.get(bias, (n_all,))))
        idx = g.op("TopK", choice, k, axis=-1, n_out=2)[1]
        weights = g.op("GatherElements", scores, idx, axis=1)
        return g.op("Mul", weights, g.f32(moe.routed_scaling_factor)), idx
    w = g.f32_tensor(f"{prefix}.gate.weight", rd.get(f"{prefix}.gate.weight", (n_exp, cfg.hidden_size)))
    logits = g.op("Gemm", x, w, transB=1)  # [T, E], f32 as transformers computes the router
    if moe.scoring == "sigmoid":  # DeepseekV3TopkRouter
        scores = g.op("Sigmoid", logits)
        bias_name = f"{prefix}.gate.e_score_correction_bias"
        if cfg.block["optional_router_bias"] and not rd.has(bias_name):
            bias_value = np.zeros(n_exp, np.float32)  # transformers' init when the file has none (A.X-K1)
        else:
            bias_value = rd.get(bias_name, (n_exp,))
        bias = g.f32_tensor(bias_name, bias_value)
        choice = g.op("Add", scores, bias)
        if moe.topk_group < moe.n_group:  # with every group kept the mask is all true: skip it
            keep = _group_mask(g, choice, n_exp, moe.n_group, moe.topk_group, "top2_sum")
            choice = g.op("Where", keep, choice, g.f32(float("-inf")))
        idx = g.op("TopK", choice, k, axis=-1, n_out=2)[1]
        weights = g.op("GatherElements", scores, idx, axis=1)  # the un-biased scores weigh the experts
        if moe.norm_topk_prob:
            denom = g.op("Add", g.op("ReduceSum", weights, g.i64(-1), keepdims=1), g.f32(1e-20))
            weights = g.op("Div", weights, denom)
    elif moe.topk_method == "group_top2":  # Mistral4TopkRouter: softmax, top-2-sum groups, optional renorm
        scores = g.op("Softmax", logits, axis=-1)
        choice = scores
        if moe.topk_group < moe.n_group:
            keep = _group_mask(g, scores, n_exp, moe.n_group, moe.topk_group, "top2_sum")
            choice = g.op("Where", keep, scores, g.f32(0.0))
        idx = g.op("TopK", choice, k, axis=-1, n_out=2)[1]
        weights = g.op("GatherElements", scores, idx, axis=1)
        if moe.norm_topk_prob:
            denom = g.op("Add", g.op("ReduceSum", weights, g.i64(-1), keepdims=1), g.f32(1e-20))
            weights = g.op("Div", weights, denom)
    else:  # DeepseekV2TopkRouter; it ignores norm_topk_prob in transformers 5.25, and so do we
        scores = g.op("Softmax", logits, axis=-1)
        if moe.topk_method == "group_limited_greedy" and moe.topk_group < moe.n_group:
            keep = _group_mask(g, scores, n_exp, moe.n_group, moe.topk_group, "max")
            scores = g.op("Where", keep, scores, g.f32(0.0))
        weights, idx = g.op("TopK", scores, k, axis=-1, n_out=2)
    return g.op("Mul", weights, g.f32(moe.routed_scaling_factor)), idx


class _ExpertWeights:
    """Each expert's (gate [I, hidden], up [I, hidden], down [hidden, I]) in the checkpoint layout:
    one tensor per expert and projection (DeepSeek's and save_pretrained's files), or transformers'
    in-memory fused `experts.gate_up_proj [E, 2I, hidden]` / `experts.down_proj [E, hidden, I]`."""

    def __init__(self, rd: CheckpointReader, prefix: str, n_exp: int, hidden: int, inter: int):
        self.rd, self.prefix, self.hidden, self.inter = rd, prefix, hidden, inter
        self.fused = None
        if not rd.has(f"{prefix}.experts.0.gate_proj.weight"):
            self.fused = (rd.get(f"{prefix}.experts.gate_up_proj", (n_exp, 2 * inter, hidden)),
                          rd.get(f"{prefix}.experts.down_proj", (n_exp, hidden, inter)))

    PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

    def fp8(self, e: int, proj: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Expert e's own FP8 (codes, row scales) of `proj` when the checkpoint holds them (per-expert
        files, as DeepSeek's), else None."""
        if self.fused is not None:
            return None
        shape = (self.hidden, self.inter) if proj == "down_proj" else (self.inter, self.hidden)
        return self.rd.fp8_rows(f"{self.prefix}.experts.{e}.{proj}.weight", shape)

    def one(self, e: int, proj: str) -> np.ndarray:
        """Projection `proj` of expert e as [out, in]."""
        j = self.PROJECTIONS.index(proj)
        if self.fused is not None:
            return (self.fused[0][e, :self.inter], self.fused[0][e, self.inter:], self.fused[1][e])[j]
        shape = (self.hidden, self.inter) if proj == "down_proj" else (self.inter, self.hidden)
        return self.rd.get(f"{self.prefix}.experts.{e}.{proj}.weight", shape)

    def sources(self, projs: tuple[str, ...], experts) -> tuple[str, ...]:
        """The checkpoint tensor names the projections `projs` of `experts` are read from (what a
        --tensor-format pattern is searched in: tensor_formats.py)."""
        if self.fused is not None:  # one tensor holds every expert: gate_up_proj, down_proj
            return tuple(dict.fromkeys(f"{self.prefix}.experts.{'down_proj' if p == 'down_proj' else 'gate_up_proj'}"
                                       for p in projs))
        return tuple(f"{self.prefix}.experts.{e}.{p}.weight" for e in experts for p in projs)

    def shape(self, proj: str) -> tuple[int, int]:
        return (self.hidden, self.inter) if proj == "down_proj" else (self.inter, self.hidden)


def _silu_mul(g: GraphBuilder, gate: str, up: str) -> str:
    return g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)


def _grouped(g: GraphBuilder, experts: _ExpertWeights, x: str, weights: str, idx: str, n_exp: int, out: str,
             stacked: dict | None = None) -> str:
    """Sort (token, slot) pairs by expert, one Split, each expert's Gemms on its rows, one ScatterND(add).

    Each expert's weights are its own [2I, hidden] gate_up and [hidden, I] down tensors, or, when
    `stacked` already holds every expert's (the gather_matmul form is written too), slices of
    those (onnxruntime folds the constant Gathers once, at session start)."""
    inter, prefix = experts.inter, experts.prefix
    flat_e = g.op("Reshape", idx, g.i64(-1))  # [T*k]: pair p = token * k + slot
    k = g.op("Gather", g.op("Shape", idx), g.i64(1), axis=0)  # [1]
    order = g.op("TopK", flat_e, g.op("Shape", flat_e), axis=0, largest=0, sorted=1, n_out=2)[1]  # by expert id
    tokens = g.op("Div", order, k)  # [T*k] token of each sorted pair
    rows = g.op("Gather", x, tokens, axis=0)  # [T*k, hidden]
    coef = g.op("Gather", g.op("Reshape", weights, g.i64(-1)), order, axis=0)  # [T*k]
    # rows per expert: one-hot counts summed as integers (int64: onnxruntime's OneHot has no int32
    # output). Not in f32: the CPU plugin computes float nodes in bf16 when asked for it, and bf16
    # holds integers exactly only up to 256 (an expert with 257+ rows in a long prefill made the Split
    # lengths miss the row count).
    onehot = g.op("OneHot", flat_e, g.i64(n_exp), g.i64(0, 1), axis=-1)
    counts = g.op("ReduceSum", onehot, g.i64(0), keepdims=0)  # [E] int64
    pieces = g.op("Split", rows, counts, axis=0, n_out=n_exp)
    outs = []
    for e in range(n_exp):
        ep = f"{prefix}.experts.{e}"
        if stacked is None:
            w_gate_up = g.weight(f"{ep}.gate_up_proj.weight",
                                 np.concatenate([experts.one(e, "gate_proj"), experts.one(e, "up_proj")]),
                                 sources=experts.sources(("gate_proj", "up_proj"), [e]))
            w_down = g.weight(f"{ep}.down_proj.weight", experts.one(e, "down_proj"),
                              sources=experts.sources(("down_proj",), [e]))
        else:
            w_gate_up = g.op("Concat", *(g.op("Gather", stacked[p], g.i64_scalar(e), axis=0) for p in ("gate_proj", "up_proj")),
                             axis=0)
            w_down = g.op("Gather", stacked["down_proj"], g.i64_scalar(e), axis=0)
        gate_up = g.op("Gemm", pieces[e], w_gate_up, transB=1)  # [n_e, 2I]: one weight read for both projections
        gate, up = g.op("Split", gate_up, g.i64(inter, inter), axis=1, n_out=2)
        outs.append(g.op("Gemm", _silu_mul(g, gate, up), w_down, transB=1))
    y = g.op("Mul", g.op("Concat", *outs, axis=0), g.op("Unsqueeze", coef, g.i64(1)))
    zeros = g.op("ConstantOfShape", g.op("Shape", x), value=_f32_value(0.0))
    return g.op("ScatterND", zeros, g.op("Unsqueeze", tokens, g.i64(1)), y, reduction="add", name=out)


def _stacked_weights(g: GraphBuilder, experts: _ExpertWeights, n_exp: int) -> dict[str, str]:
    """gate_proj, up_proj [E, I, hidden] and down_proj [E, hidden, I]: one g.weight call each, built
    one projection at a time (each expert tensor is read once; memory: one projection of the layer)."""
    stacked = {}
    for proj in experts.PROJECTIONS:
        arr = np.empty((n_exp, *experts.shape(proj)), np.float32)
        for e in range(n_exp):
            arr[e] = experts.one(e, proj)
        stacked[proj] = g.weight(f"{experts.prefix}.experts.{proj}.stacked", arr,
                                 sources=experts.sources((proj,), range(n_exp)))
        del arr
    return stacked


def _gather_matmul(g: GraphBuilder, stacked: dict, x: str, weights: str, idx: str, n_exp: int, hidden: int,
                   out: str) -> str:
    """The vectorized-experts pattern OpenVINO rewrites to GatherMatmul (see the module doc)."""
    # ONNX MatMul has no transpose_b: the weights go through Transpose, which the IR conversion
    # folds into MatMul(transpose_b=True) on the stacked [E, out, in] constant (openvino_ir.py).
    wt = {n: g.op("Transpose", v, perm=[0, 2, 1]) for n, v in stacked.items()}
    tiled = g.op("Reshape", g.op("Tile", x, g.i64(n_exp, 1)), g.i64(n_exp, -1, hidden))  # [E, T, hidden]
    act = _silu_mul(g, g.op("MatMul", tiled, wt["gate_proj"]), g.op("MatMul", tiled, wt["up_proj"]))
    down = g.op("Reshape", g.op("MatMul", act, wt["down_proj"]), g.i64(n_exp, -1, hidden))
    n_tok = g.op("Slice", g.op("Shape", x), g.i64(0), g.i64(1))  # [1]
    zeros = g.op("ConstantOfShape", g.op("Concat", n_tok, g.i64(n_exp), axis=0), value=_f32_value(0.0))  # [T, E]
    scattered = g.op("ScatterElements", zeros, idx, weights, axis=1)  # each token's weights at its experts
    route = g.op("Reshape", g.op("Transpose", scattered, perm=[1, 0]), g.i64(n_exp, -1, 1))  # [E, T, 1]
    return g.op("ReduceSum", g.op("Mul", down, route), g.i64(0), keepdims=0, name=out)


def fused_form_problem(cfg: MLAModelConfig, fmt: WeightFormat) -> str | None:
    """Why the fused MoE op cannot hold this model's experts in this weight format (None: it can)."""
    if fmt.fmt not in CODE_FORMATS:
        return f"the fused MoE op reads int8/int4/fp8 weights (this export stores {fmt.fmt})"
    hidden, inter = cfg.hidden_size, cfg.moe.moe_intermediate_size
    if hidden % 32 or inter % 32:
        return f"the fused MoE op needs hidden and moe_intermediate sizes divisible by 32 (got {hidden}, {inter})"
    if fmt.fmt == "int4":
        for name, n in (("hidden", hidden), ("moe_intermediate", inter)):
            group = pick_group(n, fmt.group_size)
            if group % 32:
                return (f"the fused MoE op needs int4 groups of a multiple of 32 inputs; --group-size "
                        f"{fmt.group_size} gives {group} on the {name} size {n}")
    return None


def _fused(g: GraphBuilder, experts: _ExpertWeights, x: str, weights: str, idx: str, n_exp: int, out: str) -> str:
    """One MlaMoeExperts node; each projection's codes streamed to the weights file expert by expert."""
    fmt, hidden, inter, prefix = g.store.format, experts.hidden, experts.inter, experts.prefix

    def matrix(proj: str, e: int) -> np.ndarray:
        if proj == "w13":
            return np.concatenate([experts.one(e, "gate_proj"), experts.one(e, "up_proj")])
        return experts.one(e, "down_proj")

    def fp8_source(proj: str, e: int):
        """The checkpoint's own fp8 codes and row scales of expert e's projection, or None."""
        if proj == "w2":
            return experts.fp8(e, "down_proj")
        gate, up = experts.fp8(e, "gate_proj"), experts.fp8(e, "up_proj")
        if gate is None or up is None or gate[1].shape[-1] != up[1].shape[-1]:
            return None
        return np.concatenate([gate[0], up[0]]), np.concatenate([gate[1], up[1]])

    operands, bits_of = [], {}
    for proj, rows, n_in in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
        name = f"{prefix}.experts.{proj}"
        bits = fmt.bits("matmul", name, experts.sources(("down_proj",) if proj == "w2" else ("gate_proj", "up_proj"),
                                                        range(n_exp)))
        bits_of[proj] = bits
        if fmt.planning:  # rank the projection by the int4 error of a few experts' rows
            if bits == 4:
                sample = np.concatenate([matrix(proj, e) for e in sorted({0, n_exp // 2, n_exp - 1})])
                fmt.sensitivity[name] = (_int4_error(sample, fmt.group_size), n_exp * rows * n_in)
            continue
        if bits == FP8_BITS:  # the checkpoint's own block width when its codes are kept, else 128
            first = fp8_source(proj, 0)
            group = n_in // first[1].shape[-1] if first is not None else fp8_group(n_in)
        else:
            group = pick_group(n_in, fmt.group_size) if bits == 4 else n_in
        scales = np.empty((n_exp, rows, n_in // group), np.float32)
        zeros = np.empty((n_exp, rows, n_in // group), np.uint8)

        def codes():
            for e in range(n_exp):
                if bits == FP8_BITS:
                    src = fp8_source(proj, e)
                    if src is not None and src[1].shape[-1] != n_in // group:
                        src = None  # another block width than expert 0's: quantized afresh at its group
                    q, scales[e], zeros[e] = fp8_operands(None if src is not None else matrix(proj, e), group, src)
                else:
                    q, scales[e], zeros[e] = moe_operands(quantize(matrix(proj, e), bits, group))
                yield q.tobytes()

        per_byte = 2 if bits == 4 else 1
        operands.append(g.store.add_chunks(f"{name}.q", TensorProto.UINT8, (n_exp, rows, n_in // per_byte), codes()))
        operands.append(g.store.add(f"{name}.scale", scales))
        operands.append(g.store.add(f"{name}.zp", zeros))
        if bits == FP8_BITS:
            fmt.record("fp8", n_exp * rows * n_in)
        else:
            fmt.record(f"int{bits}", n_exp * rows * n_in, group if bits == 4 else None)
    if fmt.planning:
        return out
    return g.op("MlaMoeExperts", x, idx, weights, *operands, domain="mla_export", name=out,
                w13_bits=bits_of["w13"], w2_bits=bits_of["w2"])


def moe(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, x: str,
        forms: dict[str, str] | None = None, prefix: str | None = None) -> str:
    """Routed experts on their selected tokens only, plus the shared experts.

    forms: graph variant -> MoE form (default: grouped everywhere). Router and shared experts are
    emitted once for all variants; when the forms differ, the expert weights are still stored once
    (stacked), and the grouped form takes each expert's slice of them."""
    from .layers import dense_mlp

    forms = forms or {v: "grouped" for v in g.variants}
    if set(forms) != set(g.variants) or not set(forms.values()) <= set(MOE_FORMS):
        raise ValueError(f"MoE forms must map each graph variant {sorted(g.variants)} to one of "
                         f"{', '.join(MOE_FORMS)}, got {forms!r}")
    prefix = prefix or f"model.layers.{i}.mlp"
    hidden, inter, n_exp = cfg.hidden_size, cfg.moe.moe_intermediate_size, cfg.moe.n_routed_experts
    weights, idx = router(g, rd, cfg, prefix, x)
    identity = None
    if cfg.moe.zero_experts:  # LongCat-Flash: ids >= E are identity experts, x times their summed weight
        is_zero = g.op("GreaterOrEqual", idx, g.i64(n_exp))
        zero_w = g.op("Where", is_zero, weights, g.f32(0.0))
        identity = g.op("Mul", x, g.op("ReduceSum", zero_w, g.i64(-1), keepdims=1))
        weights = g.op("Where", is_zero, g.f32(0.0), weights)  # the real experts get weight 0 there
        idx = g.op("Where", is_zero, g.i64(0), idx)  # any real expert: it is weighed by 0
    experts = _ExpertWeights(rd, prefix, n_exp, hidden, inter)
    by_form = {f: [v for v in forms if forms[v] == f] for f in MOE_FORMS if f in forms.values()}
    out = f"{prefix}.routed_experts"  # each form's last node writes this name in its own variants
    stacked = None
    if "fused" in by_form:
        problem = fused_form_problem(cfg, g.store.format)
        if problem:
            raise ValueError(problem)
        _fused(g.only(by_form["fused"]), experts, x, weights, idx, n_exp, out)
    if "gather_matmul" in by_form:
        stacked = _stacked_weights(g, experts, n_exp)
        _gather_matmul(g.only(by_form["gather_matmul"]), stacked, x, weights, idx, n_exp, hidden, out)
    if "grouped" in by_form:
        _grouped(g.only(by_form["grouped"]), experts, x, weights, idx, n_exp, out, stacked)
    if identity is not None:
        out = g.op("Add", out, identity)
    if cfg.moe.n_shared_experts:
        shared = dense_mlp(g, rd, f"{prefix}.shared_experts", x, hidden, inter * cfg.moe.n_shared_experts, cfg.mlp_bias)
        out = g.op("Add", out, shared)
    return out
