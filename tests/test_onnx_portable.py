"""The portable ONNX functions (standard ops only) in plain onnxruntime against the float64
reference: cache update (padding slots untouched, rows rounded to the cache dtype) and causal
paged attention over shuffled block tables with NaN in every unowned row and -1 table padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mla_export.ops import onnx_ops
from mla_export.ops import reference as ref
from paged_problems import make_problem, randn, rel_err

H, DN, DR, R, DV, BS = 3, 16, 8, 24, 12, 4
W = R + DR
SCALE = 0.377


def _model(cache_type) -> onnx.ModelProto:
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    vi = helper.make_tensor_value_info
    inputs = [vi("kv_c", f, ["T", R]), vi("k_pe", f, ["T", DR]), vi("kv_cache", cache_type, ["NB", BS, W]),
              vi("slot_mapping", i32, ["T"]), vi("q_nope", f, ["T", H, DN]), vi("q_pe", f, ["T", H, DR]),
              vi("w_uk", f, [H, DN, R]), vi("w_uv", f, [H, R, DV]), vi("query_start_loc", i32, ["B1"]),
              vi("seq_lens", i32, ["B"]), vi("block_tables", i32, ["B", "M"])]
    nodes = [onnx_ops.cache_update_node("kv_c", "k_pe", "kv_cache", "slot_mapping", "cache_out", "update"),
             onnx_ops.portable_attention_node("q_nope", "q_pe", "cache_out", "w_uk", "w_uv", "query_start_loc",
                                              "seq_lens", "block_tables", "out", "attend", scale=SCALE)]
    graph = helper.make_graph(nodes, "portable", inputs, [vi("out", f, ["T", H, DV]),
                                                           vi("cache_out", cache_type, ["NB", BS, W])])
    model = helper.make_model(graph, opset_imports=onnx_ops.opset_imports(portable=True), ir_version=10)
    model.functions.extend(onnx_ops.portable_functions())
    onnx.checker.check_model(model)
    return model


def _feeds(rng, seq_lens, qlens):
    p = make_problem(rng, seq_lens, qlens, W, BS)
    slots = []
    for b, (n, q) in enumerate(zip(p.seq_lens, p.qlens)):
        pos = np.arange(n - q, n)
        slots.append(p.block_tables[b, pos // BS] * BS + pos % BS)
    slots = np.concatenate(slots).astype(np.int32)
    t = len(slots)
    feeds = dict(kv_c=randn(rng, (t, R)), k_pe=randn(rng, (t, DR)), kv_cache=p.kv_cache, slot_mapping=slots,
                 q_nope=randn(rng, (t, H, DN)), q_pe=randn(rng, (t, H, DR)), w_uk=randn(rng, (H, DN, R), scale=0.3),
                 w_uv=randn(rng, (H, R, DV), scale=0.3), query_start_loc=p.query_start_loc, seq_lens=p.seq_lens,
                 block_tables=p.block_tables)
    feeds["kv_cache"].reshape(-1, W)[slots] = np.nan  # the new rows: NaN shows if read before written
    return feeds


@pytest.mark.parametrize("seq_lens,qlens", [
    ([5], [5]),                      # fresh prefill
    ([1, 30, 9], [1, 1, 1]),         # decode
    ([9, 57, 151], [9, 17, 5]),      # prefill + cached-prefix continuations
    ([12, 3, 40, 1], [4, 3, 1, 1]),  # mixed
])
def test_portable_attention_matches_reference(rng, seq_lens, qlens):
    sess = ort.InferenceSession(_model(TensorProto.FLOAT).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds(rng, seq_lens, qlens)
    out, cache_out = sess.run(None, feeds)
    cache = ref.cache_write(feeds["kv_c"], feeds["k_pe"], feeds["kv_cache"].astype(np.float64), feeds["slot_mapping"])
    expected = ref.paged_attention_absorbed(feeds["q_nope"], feeds["q_pe"], cache, feeds["w_uk"], feeds["w_uv"],
                                            feeds["query_start_loc"], feeds["seq_lens"], feeds["block_tables"], SCALE)
    assert not np.isnan(out).any()
    assert rel_err(out, expected) < 2e-5
    np.testing.assert_array_equal(cache_out, cache.astype(np.float32))  # NaN rows compare equal to NaN rows


def test_cache_update_skips_padding_slots(rng):
    sess = ort.InferenceSession(_model(TensorProto.FLOAT).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds(rng, [8], [8])
    feeds["slot_mapping"][-1] = -1  # padding: that row stays untouched
    feeds["kv_cache"].reshape(-1, W)[:] = 5.0
    before = feeds["kv_cache"].copy()
    feeds["seq_lens"][:] = 7  # the padded token is not part of the sequence
    feeds["query_start_loc"][-1] = 8
    _, cache_out = sess.run(None, feeds)
    flat_out, flat_before = cache_out.reshape(-1, W), before.reshape(-1, W)
    written = feeds["slot_mapping"][:-1]
    np.testing.assert_array_equal(flat_out[written], np.concatenate([feeds["kv_c"], feeds["k_pe"]], 1)[:-1])
    untouched = np.setdiff1d(np.arange(flat_out.shape[0]), written)
    np.testing.assert_array_equal(flat_out[untouched], flat_before[untouched])


def test_bf16_cache_rows_are_rounded(rng):
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    sess = ort.InferenceSession(_model(TensorProto.BFLOAT16).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds(rng, [6, 20], [6, 2])
    feeds["kv_cache"] = feeds["kv_cache"].astype(bf16)
    # onnxruntime's numpy binding does not know ml_dtypes: bind the bf16 bits with an explicit type,
    # and give the updated cache a preallocated bf16 buffer of ours.
    binding = sess.io_binding()
    for name, value in feeds.items():
        if name == "kv_cache":
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(value.view(np.uint16), TensorProto.BFLOAT16)
            binding.bind_ortvalue_input(name, value)
        else:
            binding.bind_cpu_input(name, value)
    cache_out = np.empty_like(feeds["kv_cache"])
    binding.bind_ortvalue_output("cache_out", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        cache_out.view(np.uint16), TensorProto.BFLOAT16))
    binding.bind_output("out")
    sess.run_with_iobinding(binding)
    out = binding.get_outputs()[1].numpy()  # (the bf16 output is already in cache_out)
    cache = ref.cache_write(feeds["kv_c"], feeds["k_pe"], feeds["kv_cache"].astype(np.float64), feeds["slot_mapping"])
    cache = cache.astype(bf16)  # rows rounded to bf16 as stored
    np.testing.assert_array_equal(cache_out.astype(np.float32), cache.astype(np.float32))
    expected = ref.paged_attention_absorbed(feeds["q_nope"], feeds["q_pe"], cache, feeds["w_uk"], feeds["w_uv"],
                                            feeds["query_start_loc"], feeds["seq_lens"], feeds["block_tables"], SCALE)
    assert rel_err(out, expected) < 2e-5
