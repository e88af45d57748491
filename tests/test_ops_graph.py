"""The ops inside real graphs: an ONNX model with the write and the attention read by OpenVINO
through the extension's ONNX mapping, saved as IR and read back; the cache is written in place
into the caller's array under the plugin's default precision, the write is ordered before the
read by the `after` input, and attribute values (scale, form) survive ONNX and IR."""

import numpy as np
import onnx
import openvino as ov
import pytest
from onnx import TensorProto, helper

from mla_export import ov_core
from mla_export.ops import reference as ref
from mla_export.ops.cache_binding import cache_binding
from mla_export.ops.ov_tensors import BF16, shared_tensor
from paged_problems import make_problem, randn, rel_err

H, DN, DR, R, DV, BS = 4, 16, 8, 32, 12, 8
SCALE = 0.731  # far from any default, so a dropped attribute shows


def write_then_attend_onnx(cache_storage: str) -> bytes:
    """kv_c, k_pe, kv_cache, slot_mapping, q_nope, q_pe, metadata -> MlaCacheWrite -> MlaPagedAttention."""
    f = TensorProto.FLOAT
    i32 = TensorProto.INT32
    cache_type, width = (f, R + DR) if cache_storage == "f32" else (TensorProto.UINT8, 2 * (R + DR))
    inputs = [
        helper.make_tensor_value_info("kv_c", f, ["T", R]),
        helper.make_tensor_value_info("k_pe", f, ["T", DR]),
        helper.make_tensor_value_info("kv_cache", cache_type, ["NB", BS, width]),
        helper.make_tensor_value_info("slot_mapping", i32, ["T"]),
        helper.make_tensor_value_info("q_nope", f, ["T", H, DN]),
        helper.make_tensor_value_info("q_pe", f, ["T", H, DR]),
        helper.make_tensor_value_info("w_uk", f, [H, DN, R]),
        helper.make_tensor_value_info("w_uv", f, [H, R, DV]),
        helper.make_tensor_value_info("query_start_loc", i32, ["B1"]),
        helper.make_tensor_value_info("seq_lens", i32, ["B"]),
        helper.make_tensor_value_info("block_tables", i32, ["B", "M"]),
    ]
    nodes = [
        helper.make_node("MlaCacheWrite", ["kv_c", "k_pe", "kv_cache", "slot_mapping"], ["written"], domain="mla_export"),
        helper.make_node("MlaPagedAttention", ["q_nope", "q_pe", "kv_cache", "w_uk", "w_uv", "query_start_loc",
                                               "seq_lens", "block_tables", "written"], ["attn"],
                         domain="mla_export", scale=SCALE, form=1),
        # A second consumer downstream of the attention, so the graph has several ordinary ops too.
        helper.make_node("Relu", ["attn"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "write_then_attend", inputs,
                              [helper.make_tensor_value_info("out", f, ["T", H, DV])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])
    return model.SerializeToString()


def problem(rng, cache_dtype):
    # Three sequences; their new tokens are written by this very step, then attended to.
    p = make_problem(rng, [13, 6, 30], [4, 6, 1], R + DR, BS, cache_dtype)
    t = int(p.qlens.sum())
    slots = []
    for b in range(3):
        pos = np.arange(p.seq_lens[b] - p.qlens[b], p.seq_lens[b])
        slots.append(p.block_tables[b, pos // BS] * BS + pos % BS)
    slots = np.concatenate(slots).astype(np.int32)
    feeds = dict(kv_c=randn(rng, (t, R)), k_pe=randn(rng, (t, DR)), slot_mapping=slots,
                 q_nope=randn(rng, (t, H, DN)), q_pe=randn(rng, (t, H, DR)), w_uk=randn(rng, (H, DN, R), scale=0.3),
                 w_uv=randn(rng, (H, R, DV), scale=0.3), query_start_loc=p.query_start_loc, seq_lens=p.seq_lens,
                 block_tables=p.block_tables)
    # The new tokens' rows are NaN before the step: if the read ran before the write, NaN shows.
    flat = p.kv_cache.reshape(-1, R + DR)
    flat[slots] = np.nan
    return p.kv_cache, feeds


def expected_output(cache_before, feeds):
    cache = ref.cache_write(feeds["kv_c"], feeds["k_pe"], cache_before.astype(np.float64), feeds["slot_mapping"])
    cache = cache.astype(cache_before.dtype)  # rows rounded to the cache dtype, as the op stores them
    out = ref.paged_attention_absorbed(feeds["q_nope"], feeds["q_pe"], cache, feeds["w_uk"], feeds["w_uv"],
                                       feeds["query_start_loc"], feeds["seq_lens"], feeds["block_tables"], SCALE)
    return cache, np.maximum(out, 0)


def run(compiled, cache, feeds):
    req = compiled.create_infer_request()
    bound = cache_binding(cache)  # kept alive by this frame while the request runs
    for name, arr in feeds.items():
        req.set_tensor(name, shared_tensor(np.ascontiguousarray(arr)))
    req.set_tensor("kv_cache", shared_tensor(bound))
    req.infer()
    return req.get_tensor("out").data.copy()


@pytest.mark.parametrize("cache_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("config", [{}, {"INFERENCE_PRECISION_HINT": "bf16"}, {"INFERENCE_PRECISION_HINT": "f32"}],
                         ids=["default", "bf16-hint", "f32-hint"])
def test_onnx_graph_writes_in_place_then_attends(rng, tmp_path, cache_dtype, config):
    core = ov_core()
    path = tmp_path / "m.onnx"
    path.write_bytes(write_then_attend_onnx(cache_dtype))
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    cache, feeds = problem(rng, cache_dtype)
    expected_cache, expected = expected_output(cache, feeds)
    out = run(compiled, cache, feeds)
    # In place: the caller's own array now holds the new rows (this fails if the plugin ever
    # binds a copy of the cache instead of the caller's memory).
    written = feeds["slot_mapping"]
    np.testing.assert_array_equal(cache.reshape(-1, R + DR)[written].astype(np.float32),
                                  expected_cache.reshape(-1, R + DR)[written].astype(np.float32))
    assert not np.isnan(out).any(), "the attention read the cache before the write"
    assert rel_err(out, expected) < 2e-5  # f32 activations; cache rows exact in their dtype


def test_attributes_survive_onnx_and_ir(rng, tmp_path):
    core = ov_core()
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(write_then_attend_onnx("f32"))
    model = core.read_model(str(onnx_path))
    attn = [op for op in model.get_ordered_ops() if op.get_type_name() == "MlaPagedAttention"]
    assert len(attn) == 1
    xml = tmp_path / "m.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    text = xml.read_text()
    assert 'type="MlaPagedAttention"' in text and 'version="mla_export"' in text
    assert 'form="1"' in text and "scale=" in text
    saved = float(text.split('scale="')[1].split('"')[0])
    assert np.float32(saved) == np.float32(SCALE)
    reread = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    cache, feeds = problem(rng, "f32")
    _, expected = expected_output(cache, feeds)
    assert rel_err(run(reread, cache, feeds), expected) < 2e-5


def test_retired_decode_op_is_refused_by_name(tmp_path):
    """MlaPagedDecode is retired (no export ever held it; decode is MlaPagedAttention's decode
    form): a graph that still has one fails to load, naming it."""
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    node = helper.make_node("MlaPagedDecode", ["q", "kv_cache", "block_tables", "seq_lens"], ["out"],
                            domain="mla_export", scale=SCALE, kv_lora_rank=R)
    graph = helper.make_graph([node], "decode", [
        helper.make_tensor_value_info("q", f, ["B", H, R + DR]),
        helper.make_tensor_value_info("kv_cache", f, ["NB", BS, R + DR]),
        helper.make_tensor_value_info("block_tables", i32, ["B", "M"]),
        helper.make_tensor_value_info("seq_lens", i32, ["B"])], [helper.make_tensor_value_info("out", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])
    path = tmp_path / "d.onnx"
    onnx.save(model, str(path))
    with pytest.raises(Exception, match="MlaPagedDecode"):
        ov_core().read_model(str(path))

