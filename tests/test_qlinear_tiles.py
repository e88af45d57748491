"""MlaQLinear's int8, int4 and fp8 codes in 16-row tiles (layout = "tile16"; qmatmul.hpp, runtime/qlinear_tiles.py).

The layout functions against an explicit index formula; the op on tile16 codes against the
float64 reference in both runtimes (f32 compute: exact, through the 4-row kernels; compute="bf16":
the reference on int8 activations, through the tile16 VNNI dots where the CPU has them, through the
4-row ones of every other table; fp8 codes: the reference on bf16-rounded activations where the
bf16 dots run); the attribute's errors; and the runtime's in-place rewrite of an int8 export: exact
against transformers at f32 (the rewrite forced, kernel configuration qlinear=tile16), and at bf16
the same logits as the exported layout up to the f32 folds' order (an fp8 export's too).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mla_export.ops import kernel_config
from mla_export.ops import reference as ref
from mla_export.export.quantize import dequantize, moe_operands, quantize
from mla_export.runtime.qlinear_tiles import (factors_to_tile16, rows4_to_tile16, tile16_to_factors, tile16_to_rows4,
                                               to_tile16)
from test_moe_experts_op import RUNTIMES, TOL, int8_activations_here

NAMES = ["w_q", "w_s", "w_zp"]


def _model(k, n, weights, compute="f32", layout="tile16", bits=8):
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), name) for a, name in zip(weights, NAMES)]
    node = helper.make_node("MlaQLinear", ["x"] + NAMES, ["y"], domain="mla_export", bits=bits, compute=compute,
                            layout=layout)
    graph = helper.make_graph([node], "qlinear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


@pytest.fixture(autouse=True)
def _restore_kernel_config():
    """Tests here set the kernel configuration's qlinear layout; each leaves it as it found it."""
    before = kernel_config.config().spec
    yield
    kernel_config.configure(before)


def _case(rng, n, k, group=None, bits=8):
    """int8 (per channel, or in groups) or int4 codes of a random [n, k] weight, in the tile16 layout."""
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    qw = quantize(w, bits, group)
    return list(to_tile16(*moe_operands(qw))), dequantize(qw)


def test_layout_index_formula(rng):
    """Row 4b + r, input 16c + j of the 4-row layout at byte b * 4K + (4c + r) * 16 + j; row 16i + r,
    input 4q + e of tile16 at byte 16i * K + 64q + 4r + e; the two functions invert each other."""
    n, k = 48, 96
    w = rng.integers(0, 256, (n, k), dtype=np.uint8)
    rows4 = np.zeros(n * k, np.uint8)
    tile16 = np.zeros(n * k, np.uint8)
    for row in range(n):
        for col in range(k):
            rows4[(row // 4) * 4 * k + (4 * (col // 16) + row % 4) * 16 + col % 16] = w[row, col]
            tile16[(row // 16) * 16 * k + 64 * (col // 4) + 4 * (row % 16) + col % 4] = w[row, col]
    rows4, tile16 = rows4.reshape(n, k), tile16.reshape(n, k)
    assert np.array_equal(rows4_to_tile16(rows4), tile16)
    assert np.array_equal(tile16_to_rows4(tile16), rows4)
    with pytest.raises(ValueError, match="N % 16"):
        rows4_to_tile16(np.zeros((40, 64), np.uint8))
    # scales and zero points [N, G]: row 16i + r, group g at 16i * G + 16g + r
    g = 3
    f = rng.random((n, g)).astype(np.float32)
    tiled = np.zeros(n * g, np.float32)
    for row in range(n):
        for grp in range(g):
            tiled[(row // 16) * 16 * g + 16 * grp + row % 16] = f[row, grp]
    assert np.array_equal(factors_to_tile16(f), tiled.reshape(n, g))
    assert np.array_equal(tile16_to_factors(tiled.reshape(n, g)), f)
    experts = rng.integers(0, 16, (2, 32, 4), dtype=np.uint8)  # each expert's matrix its own tiles
    assert np.array_equal(factors_to_tile16(experts), np.stack([factors_to_tile16(e) for e in experts]))


SHAPES = [  # N, K, group (None: per channel), rows of x, bits
    (32, 64, None, 1, 8), (64, 256, None, 2, 8), (96, 128, None, 3, 8), (64, 2048, None, 4, 8), (128, 256, 64, 5, 8),
    (32, 256, 128, 8, 8), (64, 96, 32, 11, 8), (96, 64, None, 300, 8),
    # int4: a line's low nibbles and its high ones 16 inputs apart; 1-2 rows in 4 chains, groups of 32-128
    (32, 64, 32, 1, 4), (64, 512, 128, 2, 4), (96, 128, 64, 3, 4), (64, 2048, 128, 4, 4), (32, 256, 32, 9, 4),
    (64, 192, 64, 300, 4),
    # 1-2 rows over several tiles a core: a run's first half paired with its second (two streams), an
    # odd run's last tile alone
    (224, 256, None, 1, 8), (352, 128, None, 2, 8), (160, 512, 128, 1, 4), (288, 64, 32, 2, 4)]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N{}-K{}-g{}-M{}-int{}".format(*s))
def test_tile16_matches_reference(rng, runtime, shape):
    n, k, group, m, bits = shape
    weights, w = _case(rng, n, k, group, bits)
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = ref.linear(x, w)
    scale = np.abs(want).max()
    got = RUNTIMES[runtime](_model(k, n, weights, "f32", bits=bits), {"x": x})
    assert np.abs(got - want).max() / scale < TOL
    got = RUNTIMES[runtime](_model(k, n, weights, "bf16", bits=bits), {"x": x})
    if int8_activations_here():  # every row exactly the reference on int8 activations
        row_err = np.abs(got - ref.linear(x, w, q8_group=group or k)).max(axis=1) / scale
        assert row_err.max() < 1e-4, (row_err.argmax(), row_err.max())
    else:
        assert np.abs(got - want).max() / scale < TOL


FP8_SHAPES = [  # N, K, group, rows of x: 1-2 rows one tile a call, from 3 both tiles, passes of 8 and a tail
    (32, 128, 128, 1), (64, 256, 128, 2), (96, 512, 128, 3), (64, 2048, 128, 8), (32, 384, 128, 11),
    (64, 256, 64, 17), (32, 96, 32, 40)]


@pytest.mark.parametrize("fp8_codes", ["lut", "shift"])
@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: "N{}-K{}-g{}-M{}".format(*s))
def test_fp8_tile16_matches_reference(rng, runtime, shape, fp8_codes):
    """fp8 (e4m3) codes in the tile16 layout: f32 exact on the codes' values (through the 4-row
    kernels); compute="bf16" exact on bf16-rounded activations where the bf16 dots run (the tile16
    lookups' qdot_fp8_t16 under fp8_codes=lut, the 4-row shifts under shift), f32 otherwise."""
    from test_fp8_weights_op import _bf16_path, _bf16_reference, _fp8
    from mla_export.export.quantize import FP8_BITS

    if fp8_codes == "lut" and "avx512vbmi" not in kernel_config.cpu_features():
        pytest.skip("the lookups need AVX512-VBMI")
    kernel_config.configure(f"fp8_codes={fp8_codes}")
    n, k, group, m = shape
    weights, w = _fp8(rng, (n, k), group)
    tiled = list(to_tile16(*weights))
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = ref.linear(x, w)
    scale = np.abs(want).max()
    got = RUNTIMES[runtime](_model(k, n, tiled, "f32", bits=FP8_BITS), {"x": x})
    assert np.abs(got - want).max() / scale < TOL
    got = RUNTIMES[runtime](_model(k, n, tiled, "bf16", bits=FP8_BITS), {"x": x})
    if _bf16_path(m):
        want = _bf16_reference(x, weights)
    err = np.abs(got - want).max() / scale
    assert err < TOL, f"{runtime} {fp8_codes} N{n} K{k} g{group} M{m}: max rel error {err:.2e}"
    # and the same products as the exported 4-row layout, up to the f32 sums' order
    rows4 = RUNTIMES[runtime](_model(k, n, weights, "bf16", layout="rows4", bits=FP8_BITS), {"x": x})
    assert np.abs(got - rows4).max() / scale < TOL


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_bad_layout_names_the_attribute(rng, runtime):
    weights, _ = _case(rng, 32, 64)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(Exception, match="layout"):
        RUNTIMES[runtime](_model(64, 32, weights, layout="cols8"), {"x": x})


# --------------------------------------------------------------- the runtime's rewrite of an export

def _export(tmp_path_factory, weight_format, seed):
    """A V2-Lite-shaped tiny checkpoint exported in `weight_format`: (checkpoint, export, transformers model)."""
    from hf_models import load_hf
    from mla_export.export import export_model
    from mla_export.checkpoint.presets import make_checkpoint
    from test_export_quantized import BLOCK, CONFIGS

    model_type, overrides = CONFIGS["v2-lite"]
    root = tmp_path_factory.mktemp(f"tiles-{weight_format}")
    ckpt = make_checkpoint(root / "ckpt", model_type, seed=seed, **overrides)
    out = root / weight_format
    export_model(ckpt, out, fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_format=weight_format)
    return ckpt, out, load_hf(ckpt)


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    return _export(tmp_path_factory, "int8", 21)


@pytest.fixture(scope="module")
def int4_export(tmp_path_factory):
    return _export(tmp_path_factory, "int4", 23)


def _runner(out, cfg, precision, tiles):
    """The export compiled as the runtime's executor does (weights read into its buffer, the ops'
    compute set, the codes rewritten or not); returns run(feeds) -> logits and how many ops were
    marked tile16."""
    from mla_export import ov_core
    from mla_export.ops.cache_binding import cache_binding
    from mla_export.runtime.executor_openvino import match_moe_compute
    from mla_export.runtime.qlinear_tiles import pack_qlinear_tiles
    from mla_export.runtime.weights_memory import read_ir
    from test_export_quantized import BLOCK, NUM_BLOCKS

    kernel_config.configure("qlinear=tile16" if tiles else "qlinear=rows4")
    core = ov_core()
    model, buf = read_ir(core, out / "openvino_model.xml", out / "openvino_model.bin")
    assert buf is not None
    match_moe_compute(model, precision)
    marked = pack_qlinear_tiles(model, buf, precision)
    config = {"INFERENCE_PRECISION_HINT": precision}
    if precision == "f32":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    compiled = core.compile_model(model, "CPU", config)
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    caches = [np.full((NUM_BLOCKS, BLOCK, width), np.nan, np.float32) for _ in range(cfg.num_hidden_layers)]
    request = compiled.create_infer_request()

    def run(feeds):
        feeds = dict(feeds, **{f"kv_cache.{i}": cache_binding(c) for i, c in enumerate(caches)})
        result = request.infer(feeds, share_inputs=True)
        return result[compiled.output("logits")].copy()

    run.keep = (buf, model)  # the constants point into buf
    return run, marked, model


def test_rewritten_export_is_exact_at_f32(int8_export, rng):
    """Forced on any CPU at f32: every int8 MlaQLinear and MlaMoeExperts is marked and its codes
    rewritten in place (the experts' f32 dots rewrite each tile back into the 4-row layout),
    and the logits stay within 1e-4 of transformers on the weights the codes decode to (as the
    exported layout's, test_export_quantized.py)."""
    from hf_models import PagedSession, drive_and_compare, load_hf
    from test_export_quantized import (BLOCK, NUM_BLOCKS, PROMPT_LENS, SCHEDULE, _quantize_like_the_export)
    from test_export_quantized import TOL as EXPORT_TOL

    ckpt, out, _ = int8_export
    hf = load_hf(ckpt)
    _quantize_like_the_export(hf, "int8")
    run, marked, model = _runner(out, hf.config, "f32", True)
    int8_ops = [op for op in model.get_ops()
                if (op.get_type_name() == "MlaQLinear" and op.get_attributes()["bits"] == 8)
                or (op.get_type_name() == "MlaMoeExperts" and op.get_attributes()["w13_bits"] == 8)]
    assert marked == len(int8_ops) > 0 and any(op.get_type_name() == "MlaMoeExperts" for op in int8_ops)
    assert all(op.get_attributes()["layout"] == "tile16" for op in int8_ops)
    prompts = {s: np.random.default_rng(5).integers(2, hf.config.vocab_size, n) for s, n in PROMPT_LENS.items()}
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, SCHEDULE, EXPORT_TOL)
    assert stats["agree"] == stats["total"]


def test_rewritten_export_at_bf16_matches_the_exported_layout(int8_export):
    """bf16 (int8 activations): the rewritten export's logits against the exported layout's on the
    same steps: the same int32 sums, only the f32 folds in another order."""
    _, out, hf = int8_export
    run_t16, marked, _ = _runner(out, hf.config, "bf16", True)
    run_r4, none, _ = _runner(out, hf.config, "bf16", False)
    assert marked > 0 and none == 0
    worst = _worst_difference(run_t16, run_r4, hf, seed=5)
    print(f"[qlinear tile16, bf16] max relative logits difference to the exported layout: {worst:.1e}")
    assert worst < 1e-3


def test_rewritten_int4_export(int4_export, rng):
    """An int4 export (groups of 128 and int8 head / embedding): every integer op is rewritten when
    forced (codes, and the grouped scales and zero points in tile order), f32 stays within the
    export's tolerance of transformers on the decoded weights, and at bf16 the logits match the
    exported layout's on the same steps (the same int32 sums, the f32 folds in another order)."""
    from hf_models import PagedSession, drive_and_compare
    from test_export_quantized import PROMPT_LENS, SCHEDULE, BLOCK, NUM_BLOCKS, _quantize_like_the_export
    from test_export_quantized import TOL as EXPORT_TOL

    ckpt, out, hf = int4_export
    run_t16, marked, model = _runner(out, hf.config, "bf16", True)
    run_r4, none, _ = _runner(out, hf.config, "bf16", False)
    ops = [op for op in model.get_ops() if op.get_type_name() in ("MlaQLinear", "MlaMoeExperts")]
    int4 = [op for op in ops if 4 in (op.get_attributes().get("bits"), op.get_attributes().get("w13_bits"))]
    assert int4 and none == 0 and marked == len(ops)
    assert all(op.get_attributes()["layout"] == "tile16" for op in ops)
    worst = _worst_difference(run_t16, run_r4, hf, seed=7)
    print(f"[qlinear tile16 int4, bf16] max relative logits difference to the exported layout: {worst:.1e}")
    assert worst < 1e-3
    from hf_models import load_hf

    exact = load_hf(ckpt)
    _quantize_like_the_export(exact, "int4")
    run, _, _ = _runner(out, exact.config, "f32", True)
    prompts = {s: np.random.default_rng(8).integers(2, exact.config.vocab_size, n) for s, n in PROMPT_LENS.items()}
    stats = drive_and_compare(run, exact, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, SCHEDULE, EXPORT_TOL)
    assert stats["agree"] == stats["total"]


def _worst_difference(run_a, run_b, hf, seed):
    """Both runners driven through the same steps (prompts and paging from `seed`); the largest
    relative logits difference between them."""
    from hf_models import PagedSession, drive_and_compare
    from test_export_quantized import BLOCK, NUM_BLOCKS, PROMPT_LENS, SCHEDULE

    worst = []

    def both(feeds):
        a, b = run_a(feeds), run_b(feeds)
        worst.append(float(np.abs(a - b).max() / np.abs(b).max()))
        return b

    prompts = {s: np.random.default_rng(seed).integers(2, hf.config.vocab_size, n) for s, n in PROMPT_LENS.items()}
    drive_and_compare(both, hf, PagedSession(BLOCK, NUM_BLOCKS, np.random.default_rng(seed + 1)), prompts, SCHEDULE,
                      float("inf"))
    return max(worst)


@pytest.fixture(scope="module")
def fp8_export(tmp_path_factory):
    return _export(tmp_path_factory, "fp8", 22)


def test_rewritten_fp8_export_at_bf16_matches_the_exported_layout(fp8_export):
    """An fp8 export: every fp8 MlaQLinear and MlaMoeExperts is rewritten (qlinear=tile16, and on its
    own where want_tile16 / want_moe_tile16 say so: AVX512-BF16 + VBMI without AMX), and at bf16 its
    logits match the exported layout's on the same steps (the same bf16 products, the f32 sums in
    another order)."""
    from mla_export.export.quantize import FP8_BITS
    from mla_export.runtime.qlinear_tiles import want_moe_tile16, want_tile16

    _, out, hf = fp8_export
    run_t16, marked, model = _runner(out, hf.config, "bf16", True)
    run_r4, none, _ = _runner(out, hf.config, "bf16", False)
    ops = [op for op in model.get_ops() if op.get_type_name() in ("MlaQLinear", "MlaMoeExperts")]
    fp8_ops = [op for op in ops if FP8_BITS in (op.get_attributes().get("bits"), op.get_attributes().get("w13_bits"))]
    assert len(fp8_ops) > 0 and none == 0 and any(op.get_type_name() == "MlaMoeExperts" for op in fp8_ops)
    assert all(op.get_attributes()["layout"] == "tile16" for op in fp8_ops)
    # the rest: the int8 lm_head an fp8 export keeps
    assert marked == len([op for op in ops if op.get_attributes()["layout"] == "tile16"]) == len(ops)
    kernel_config.configure("qlinear=auto")
    features = kernel_config.cpu_features()
    config = kernel_config.config()
    expect = (config.isa == "avx512" and config.fp8_codes == "lut" and not config.amx
              and {"avx512_bf16", "avx512vbmi"} <= features)
    assert want_tile16("bf16", FP8_BITS) == want_moe_tile16("bf16", FP8_BITS) == expect
    assert not want_tile16("f32", FP8_BITS) and not want_moe_tile16("f32", FP8_BITS)
    worst = _worst_difference(run_t16, run_r4, hf, seed=6)
    print(f"[qlinear tile16 fp8, bf16] max relative logits difference to the exported layout: {worst:.1e}")
    assert worst < 1e-3


def _rewritten_ir(tmp_path, nodes, outputs, inits, k):
    """The graph saved as an IR by OpenVINO, read into the runtime's buffer and rewritten with the
    tiles forced: (core, model, buffer, ops marked)."""
    import openvino as ov

    from mla_export import ov_core
    from mla_export.runtime.qlinear_tiles import pack_qlinear_tiles
    from mla_export.runtime.weights_memory import read_ir

    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              outputs, inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                         helper.make_opsetid("mla_export", 1)])
    core = ov_core()
    ov.save_model(core.read_model(onnx_model.SerializeToString()), tmp_path / "m.xml", compress_to_fp16=False)
    kernel_config.configure("qlinear=tile16")
    model, buf = read_ir(core, tmp_path / "m.xml", tmp_path / "m.bin")
    return core, model, buf, pack_qlinear_tiles(model, buf, "f32")


@pytest.mark.parametrize("shared", [False, True])
def test_rewrite_in_an_ir_and_codes_read_elsewhere(tmp_path, rng, shared):
    """An IR saved by OpenVINO and read into the runtime's buffer: its int8 MlaQLinear is rewritten
    (same products at f32, through the 4-row kernels); codes another node also reads (here a
    ReduceMax over them, as tied embeddings would) are left as exported and the op unmarked."""
    n, k = 64, 128
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    codes, s, zp = moe_operands(quantize(w, 8))
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), name) for a, name in zip([codes, s, zp], NAMES)]
    nodes = [helper.make_node("MlaQLinear", ["x"] + NAMES, ["y"], domain="mla_export", bits=8, compute="f32")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])]
    if shared:
        nodes.append(helper.make_node("ReduceMax", ["w_q"], ["top"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("top", TensorProto.UINT8, []))
    core, model, buf, marked = _rewritten_ir(tmp_path, nodes, outputs, inits, k)
    op = next(o for o in model.get_ops() if o.get_type_name() == "MlaQLinear")
    assert marked == (0 if shared else 1)
    assert op.get_attributes()["layout"] == ("rows4" if shared else "tile16")
    stored = op.input_value(1).get_node().data
    assert np.array_equal(stored, codes if shared else rows4_to_tile16(codes))
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request().infer({"x": x})
    want = ref.linear(x, dequantize(quantize(w, 8)))
    assert np.abs(got["y"] - want).max() / np.abs(want).max() < TOL


@pytest.mark.parametrize("shared", ["scales-elsewhere", "scales-by-two-ops", "scales-by-a-blocked-op"])
def test_rewrite_of_shared_scales(tmp_path, rng, shared):
    """Scales and zero points move to tile order with their codes, once however many ops read their
    bytes (OpenVINO's IR stores identical constants once); an op whose scales another node reads
    (a ReduceMax here), or an op that stays as exported (its codes read elsewhere), keeps every op
    reading the same bytes as exported. The products stay the reference's at f32 either way."""
    n, k, group = 32, 256, 64
    q0 = quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), 4, group)
    # a second projection: other codes, the same scales and zero points (stored once in the IR)
    qs = [q0, dataclasses.replace(q0, q=rng.integers(0, 16, q0.q.shape).astype(np.uint8))]
    operands = [list(moe_operands(q)) for q in qs]
    inits, nodes, outputs = [], [], []
    for i, ops in enumerate(operands):
        names = [f"{nm}{i}" for nm in NAMES]
        inits += [numpy_helper.from_array(np.ascontiguousarray(a), nm) for a, nm in zip(ops, names)]
        nodes.append(helper.make_node("MlaQLinear", ["x"] + names, [f"y{i}"], domain="mla_export", bits=4,
                                      compute="f32"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None, n]))
    if shared == "scales-elsewhere":
        nodes.append(helper.make_node("ReduceMax", ["w_s0"], ["top"], keepdims=0))
    if shared == "scales-by-a-blocked-op":
        nodes.append(helper.make_node("ReduceMax", ["w_q1"], ["top"], keepdims=0))
    if shared != "scales-by-two-ops":
        outputs.append(helper.make_tensor_value_info("top", TensorProto.FLOAT if shared == "scales-elsewhere"
                                                     else TensorProto.UINT8, []))
    core, model, buf, marked = _rewritten_ir(tmp_path, nodes, outputs, inits, k)
    qops = sorted((o for o in model.get_ops() if o.get_type_name() == "MlaQLinear"), key=lambda o: o.get_friendly_name())
    layouts = [o.get_attributes()["layout"] for o in qops]
    if shared == "scales-by-two-ops":
        assert marked == 2 and layouts == ["tile16", "tile16"]
        assert np.array_equal(qops[0].input_value(2).get_node().data, factors_to_tile16(operands[0][1]))
    else:
        assert marked == 0 and layouts == ["rows4", "rows4"]
        assert np.array_equal(qops[0].input_value(2).get_node().data, operands[0][1])
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request().infer({"x": x})
    for i, q in enumerate(qs):
        want = ref.linear(x, dequantize(q))
        assert np.abs(got[f"y{i}"] - want).max() / np.abs(want).max() < TOL, (shared, i)


@pytest.mark.parametrize("tiles", ["0", "1"])
def test_engine_says_what_it_rewrote(int8_export, tiles):
    """The engine's executor rewrites as the environment says and its describe() tells the user."""
    from mla_export.runtime import LLMEngine, SamplingParams

    _, out, _ = int8_export
    kernel_config.configure("qlinear=tile16" if tiles == "1" else "qlinear=rows4")
    engine = LLMEngine(out, precision="bf16", num_threads=2, num_blocks=32)
    assert (engine.executor.tiled_projections > 0) == (tiles == "1")
    assert ("16-row tiles" in engine.executor.describe()) == (tiles == "1")
    engine.add_request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert len(outs[0].token_ids) == 4
