"""The MLA ops through onnxruntime and the mla-export custom-op library (libmla_export_ort.so),
against the float64 reference: the kernel cases of the OpenVINO op tests, the in-place cache
write (fails if onnxruntime ever hands the op a copy of the cache), the `after` ordering input,
and the validation errors, which must name the input."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from mla_export.ops import kernels
from mla_export import ops  # noqa: E402
from mla_export.ops import kernels_onnxruntime as ok  # noqa: E402
from mla_export.ops.cache_binding import cache_binding  # noqa: E402
from mla_export.ops import reference as ref  # noqa: E402
from paged_problems import BF16, make_problem, randn, rel_err  # noqa: E402

if not ok.available():
    pytest.skip("the onnxruntime custom-op library libmla_export_ort.so was not built "
                "(no onnxruntime headers at build time: run tools/fetch_ort_headers.sh and reinstall)",
                allow_module_level=True)

TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1e-2}
SMALL = dict(h=3, dn=24, dr=16, r=32, dv=20)
ODD = dict(h=5, dn=10, dr=6, r=20, dv=12)
DEEPSEEK = dict(h=16, dn=128, dr=64, r=512, dv=128)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def expect_error(fn, *patterns):
    with pytest.raises(Exception) as info:
        fn()
    msg = str(info.value)
    for p in patterns:
        assert p in msg, f"{p!r} not in error message: {msg}"


# ------------------------------------------------------------------ MlaCacheWrite

@pytest.mark.parametrize("cache_dtype", ["f32", "bf16", "bf16-bytes"])
@pytest.mark.parametrize("src_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_cache_write_bit_exact_padding_skipped(rng, cache_dtype, src_dtype, index_dtype):
    """bf16-bytes: the bf16 cache bound as its u8 [NB, BS, 2 W] view, as the exported graphs
    declare it; the op must write the caller's bf16 array through that view."""
    nb, bs, r, dr = 6, 16, 512, 64
    cache = randn(rng, (nb, bs, r + dr), cache_dtype.split("-")[0])
    before = cache.copy()
    kv_c, k_pe = randn(rng, (8, r), src_dtype), randn(rng, (8, dr), src_dtype)
    slots = rng.choice(nb * bs, size=8, replace=False).astype(index_dtype)
    slots[-1] = -1
    bound = cache_binding(cache) if cache_dtype.endswith("bytes") else cache
    out = ok.cache_write(kv_c, k_pe, bound, slots)
    assert out is bound
    expected = ref.cache_write(kv_c, k_pe, before.copy(), slots)
    np.testing.assert_array_equal(bits(cache), bits(expected))
    changed = np.any(bits(cache).reshape(nb * bs, -1) != bits(before).reshape(nb * bs, -1), axis=1)
    assert set(np.flatnonzero(changed)) <= set(slots[:-1].tolist())


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_cache_write_block_sizes_odd_widths(rng, block_size):
    r, dr, nb = 20, 6, 5
    cache = randn(rng, (nb, block_size, r + dr))
    t = min(nb * block_size, 37)
    slots = rng.permutation(nb * block_size)[:t].astype(np.int32)
    slots[rng.random(t) < 0.2] = -1
    kv_c, k_pe = randn(rng, (t, r)), randn(rng, (t, dr))
    expected = ref.cache_write(kv_c, k_pe, cache.copy(), slots)
    ok.cache_write(kv_c, k_pe, cache, slots)
    np.testing.assert_array_equal(cache, expected)


def test_cache_write_empty_batch(rng):
    cache = randn(rng, (2, 4, 10))
    before = cache.copy()
    ok.cache_write(np.zeros((0, 8), np.float32), np.zeros((0, 2), np.float32), cache, np.zeros(0, np.int32))
    np.testing.assert_array_equal(cache, before)


# ------------------------------------------------------------------ in place

def _write_session():
    model = ok.single_op_model(
        [("MlaCacheWrite", ["kv_c", "k_pe", "kv_cache", "slot_mapping"], {}, ["written"])],
        [("kv_c", np.float32, 2), ("k_pe", np.float32, 2), ("kv_cache", np.float32, 3), ("slot_mapping", np.int32, 1)],
        [("written", np.int32, 1)])
    return ort.InferenceSession(model.SerializeToString(), sess_options=ok.session_options(num_threads=2),
                                providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("binding", ["numpy_feed", "ortvalue_feed", "iobinding"])
def test_cache_is_written_in_place(rng, binding):
    """The op must write into the caller's own buffer: no write-back here, so a copy anywhere
    (feed conversion, a Convert/Identity inserted by onnxruntime) leaves `cache` unchanged and
    fails. 40 runs with random T over the same array; `ptr` checks the array was not replaced."""
    sess = _write_session()
    r, dr, nb, bs = 24, 8, 8, 16
    cache = np.zeros((nb, bs, r + dr), np.float32)
    ptr = cache.ctypes.data
    expected = cache.copy()
    io = sess.io_binding() if binding == "iobinding" else None
    for _ in range(40):
        t = int(rng.integers(0, 12))
        slots = rng.choice(nb * bs, size=t, replace=False).astype(np.int32)
        kv_c, k_pe = randn(rng, (t, r)), randn(rng, (t, dr))
        ref.cache_write(kv_c, k_pe, expected, slots)
        feeds = {"kv_c": kv_c, "k_pe": k_pe, "kv_cache": cache, "slot_mapping": slots}
        if binding == "numpy_feed":
            (written,) = sess.run(["written"], feeds)
        elif binding == "ortvalue_feed":
            (written,) = sess.run_with_ort_values(["written"], {k: ok.ortvalue(v) for k, v in feeds.items()})
            written = written.numpy()
        else:
            values = {k: ok.ortvalue(v) for k, v in feeds.items()}
            for k, v in values.items():
                io.bind_ortvalue_input(k, v)
            io.bind_output("written")
            sess.run_with_iobinding(io)
            written = io.copy_outputs_to_cpu()[0]
        assert int(np.asarray(written)[0]) == t
        assert cache.ctypes.data == ptr
        np.testing.assert_array_equal(cache, expected)
    assert np.count_nonzero(cache) > 0


@pytest.mark.parametrize("layout", ["bf16", "bytes"])
def test_bf16_cache_written_in_place_and_read_by_attention_after_write(rng, layout):
    """The layer pattern: MlaCacheWrite's `written` feeds MlaPagedAttention's ordering input
    `after`, so the attention reads the rows written in the same run (the new tokens' own rows,
    which are NaN before the write). The bf16 cache is updated in the caller's array."""
    h, dn, dr, r, dv = SMALL["h"], SMALL["dn"], SMALL["dr"], SMALL["r"], SMALL["dv"]
    bs = 16
    for _ in range(3):
        seq_lens = np.array([int(rng.integers(1, 40)), int(rng.integers(1, 40)), 1])
        qlens = np.minimum(seq_lens, [int(rng.integers(1, 8)), 1, 1])
        p = make_problem(rng, seq_lens, qlens, r + dr, bs, "bf16")
        cache = p.kv_cache
        # The new tokens' rows are what this run writes: poison them first.
        slots = []
        for b, (L, q) in enumerate(zip(p.seq_lens, p.qlens)):
            for pos in range(L - q, L):
                slots.append(int(p.block_tables[b, pos // bs]) * bs + pos % bs)
        slots = np.array(slots, np.int32)
        cache.reshape(-1, r + dr)[slots] = np.nan
        t = len(slots)
        kv_c, k_pe = randn(rng, (t, r)), randn(rng, (t, dr))
        q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, dr))
        w_uk, w_uv = randn(rng, (h, dn, r), scale=dn ** -0.5), randn(rng, (h, r, dv), scale=r ** -0.5)
        expected_cache = ref.cache_write(kv_c, k_pe, cache.copy(), slots)
        bound = cache_binding(cache) if layout == "bytes" else cache
        out, written = ok.cache_write_then_attention(kv_c, k_pe, slots, q_nope, q_pe, bound, w_uk, w_uv,
                                                     p.query_start_loc, p.seq_lens, p.block_tables, 0.125)
        assert written == t
        np.testing.assert_array_equal(bits(cache), bits(expected_cache))
        expected = ref.paged_attention_absorbed(q_nope, q_pe, expected_cache, w_uk, w_uv, p.query_start_loc,
                                                p.seq_lens, p.block_tables, 0.125)
        assert not np.isnan(out).any(), "the attention ran before the write (read a poisoned new row)"
        assert rel_err(out, expected) <= TOL["f32"]


# ------------------------------------------------------------------ decode (MlaPagedAttention's decode form)

def ort_decode(*args, **kwargs):
    """Absorbed decode q [B, H, r + dr] -> [B, H, r]: MlaPagedAttention's decode form on onnxruntime."""
    return kernels.paged_decode(*args, runtime="onnxruntime", **kwargs)


def run_decode(rng, seq_lens, h, r, dr, bs, q_dtype="f32", cache_dtype="f32", scale=None):
    p = make_problem(rng, seq_lens, np.ones(len(seq_lens), int), r + dr, bs, cache_dtype.split("-")[0])
    q = randn(rng, (len(seq_lens), h, r + dr), q_dtype)
    scale = (r + dr) ** -0.5 if scale is None else scale
    bound = cache_binding(p.kv_cache) if cache_dtype.endswith("bytes") else p.kv_cache
    out = ort_decode(q, bound, p.block_tables, p.seq_lens, scale, kv_lora_rank=r)
    expected = ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, scale, kv_lora_rank=r)
    assert out.shape == (len(seq_lens), h, r) and out.dtype == q.dtype
    assert not np.isnan(out.astype(np.float32)).any(), "read a NaN-poisoned row no sequence owns"
    err = rel_err(out, expected)
    assert err <= TOL[q_dtype], f"relative error {err:.3g} > {TOL[q_dtype]}"


@pytest.mark.parametrize("lens", [[5], [1, 300, 33], [513, 1, 129, 7]])
@pytest.mark.parametrize("cache_dtype", ["f32", "bf16", "bf16-bytes"])
def test_decode_lengths(rng, lens, cache_dtype):
    run_decode(rng, lens, 16, 512, 64, 16, cache_dtype=cache_dtype)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_decode_block_sizes(rng, block_size):
    run_decode(rng, [1, 70, block_size + 3, 2 * block_size], 4, 64, 16, block_size)


@pytest.mark.parametrize("q_dtype", ["f32", "bf16", "f16"])
def test_decode_query_dtypes(rng, q_dtype):
    run_decode(rng, [17, 2, 40], 4, 64, 16, 16, q_dtype=q_dtype, cache_dtype="bf16" if q_dtype == "bf16" else "f32")


def test_decode_deepseek_rank_and_long_context_split(rng):
    # DeepSeek's r = 512 (given explicitly: the op has no default rank); one long sequence split
    # across the pool.
    p = make_problem(rng, [2500, 1], [1, 1], 576, 16)
    q = randn(rng, (2, 2, 576))
    out = ort_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.05, kv_lora_rank=512)
    assert rel_err(out, ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.05, 512)) <= TOL["f32"]
    run_decode(rng, [3000], 5, 20, 6, 32, scale=3.0)


# ------------------------------------------------------------------ MlaPagedAttention

def run_attention(rng, seq_lens, qlens, dims, bs=16, form="auto", act="f32", cache_dtype="f32"):
    h, dn, dr, r, dv = dims["h"], dims["dn"], dims["dr"], dims["r"], dims["dv"]
    p = make_problem(rng, seq_lens, qlens, r + dr, bs, cache_dtype.split("-")[0])
    t = int(p.qlens.sum())
    q_nope, q_pe = randn(rng, (t, h, dn), act), randn(rng, (t, h, dr), act)
    w_uk = randn(rng, (h, dn, r), act, scale=dn ** -0.5)
    w_uv = randn(rng, (h, r, dv), act, scale=r ** -0.5)
    scale = (dn + dr) ** -0.5
    args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, scale)
    bound = cache_binding(p.kv_cache) if cache_dtype.endswith("bytes") else p.kv_cache
    out = ok.paged_attention(q_nope, q_pe, bound, *args[3:], form=form)
    expected = ref.paged_attention_expanded(*args)
    assert out.shape == (t, h, dv) and out.dtype == q_nope.dtype
    assert not np.isnan(out.astype(np.float32)).any(), "read a NaN-poisoned row no sequence owns"
    err = rel_err(out, expected)
    assert err <= TOL[act], f"form={form}: relative error {err:.3g} > {TOL[act]}"


@pytest.mark.parametrize("form", ["absorbed", "expanded", "auto"])
def test_attention_mixed_batch(rng, form):
    # decode, fresh prefill, chunked-prefill continuation (mid-block end), multi-token decode, empty query.
    run_attention(rng, [300, 57, 140, 9, 12], [1, 57, 40, 3, 0], SMALL, form=form)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_attention_block_sizes(rng, block_size, form):
    run_attention(rng, [block_size + 5, 1, 130], [block_size + 5, 1, 7], ODD, bs=block_size, form=form)


@pytest.mark.parametrize("act", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("cache_dtype", ["f32", "bf16"])
def test_attention_dtypes(rng, act, cache_dtype):
    run_attention(rng, [33, 80], [33, 4], SMALL, act=act, cache_dtype=cache_dtype)


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
@pytest.mark.parametrize("cache_dtype", ["bf16", "bf16-bytes"])
def test_attention_deepseek_dims_bf16_cache(rng, form, cache_dtype):
    run_attention(rng, [64 + 17, 23], [17, 23], DEEPSEEK, form=form, cache_dtype=cache_dtype)


# ------------------------------------------------------------------ validation

R, DR, DN, DV, H = 32, 16, 8, 8, 2


@pytest.fixture
def problem(rng):
    p = make_problem(rng, [5, 20], [2, 20], R + DR, 8)
    t = int(p.qlens.sum())
    return dict(
        q_nope=randn(rng, (t, H, DN)), q_pe=randn(rng, (t, H, DR)), kv_cache=np.nan_to_num(p.kv_cache),
        w_uk=randn(rng, (H, DN, R)), w_uv=randn(rng, (H, R, DV)), query_start_loc=p.query_start_loc,
        seq_lens=p.seq_lens, block_tables=p.block_tables, scale=0.1)


def test_valid_problem_runs(problem):
    assert ok.paged_attention(**problem).shape == (22, H, DV)


@pytest.mark.parametrize("key,value,patterns", [
    ("block_tables", lambda p: np.where(p["block_tables"] >= 0, p["block_tables"] + 1000, -1),
     ["'block_tables'", "block id 10", "outside [0,"]),
    ("seq_lens", lambda p: p["seq_lens"] + np.array([0, 100], np.int32), ["'seq_lens'", "120"]),
    ("query_start_loc", lambda p: np.array([0, 7, 22], np.int32), ["'query_start_loc'", "7 new tokens", "seq_lens 5"]),
    ("query_start_loc", lambda p: np.array([0, 2, 21], np.int32), ["'query_start_loc'", "must end at T = 22"]),
    ("q_pe", lambda p: p["q_pe"][:, :, :-1], ["'q_pe'", "dimension 2"]),
    ("w_uk", lambda p: p["w_uk"][:1], ["'w_uk'", "dimension 0"]),
    ("w_uv", lambda p: p["w_uv"][:, 1:], ["'w_uv'", "dimension 1"]),
    ("kv_cache", lambda p: p["kv_cache"][0], ["'kv_cache'", "rank 3"]),
    ("seq_lens", lambda p: p["seq_lens"][:1], ["'seq_lens'", "batch size"]),
    ("block_tables", lambda p: p["block_tables"].astype(np.float32), ["'block_tables'", "must be i32 or i64", "got f32"]),
    ("q_pe", lambda p: p["q_pe"].astype(np.float64), ["'q_pe'", "must be f32, bf16 or f16"]),
    ("kv_cache", lambda p: p["kv_cache"].astype(np.float64), ["'kv_cache'"]),
])
def test_attention_rejects(problem, key, value, patterns):
    problem[key] = value(problem)
    expect_error(lambda: ok.paged_attention(**problem), "INVALID_ARGUMENT", *patterns)


def test_attention_rejects_unsupported_query_dtype(problem):
    # q_nope's type picks the registered kernel: float64 has none, onnxruntime says so by name.
    problem["q_nope"] = problem["q_nope"].astype(np.float64)
    expect_error(lambda: ok.paged_attention(**problem), "MlaPagedAttention")


def test_attention_attributes_are_checked(problem):
    expect_error(lambda: ok.paged_attention(**problem, form=7), "'form'", "got 7")
    model = ok.single_op_model(
        [("MlaPagedAttention", list(problem)[:8], {}, ["output"])],
        [(k, v.dtype, v.ndim) for k, v in list(problem.items())[:8]], [("output", np.float32, 3)])
    expect_error(lambda: ort.InferenceSession(model.SerializeToString(), sess_options=ok.session_options(),
                                              providers=["CPUExecutionProvider"]), "'scale'", "required")


def test_decode_rejects(rng):
    p = make_problem(rng, [5, 9], [1, 1], R + DR, 4)
    q = randn(rng, (2, H, R + DR))
    expect_error(lambda: ort_decode(q, p.kv_cache, p.block_tables, np.array([5, 0], np.int32), 0.1, R),
                 "'query_start_loc'", "1 new tokens, more than its seq_lens 0")
    expect_error(lambda: ort_decode(q[:, :, :-1], p.kv_cache, p.block_tables, p.seq_lens, 0.1, R), "'q_pe'",
                 "row width")
    expect_error(lambda: ort_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.1, R + DR), "kv_lora_rank")
    bad = p.block_tables.copy()
    bad[1, 2] = -7
    expect_error(lambda: ort_decode(q, p.kv_cache, bad, p.seq_lens, 0.1, R), "'block_tables'", "-7", "[1, 2]")


def test_cache_write_rejects_and_writes_nothing(rng):
    cache = randn(rng, (3, 4, R + DR))
    before = cache.copy()
    kv_c, k_pe = randn(rng, (3, R)), randn(rng, (3, DR))
    for slots, patterns in [
        ([0, 12, 1], ["'slot_mapping'", "slot 12", "outside [0, 12)"]),
        ([5, 2, 5], ["'slot_mapping'", "slot 5 twice"]),
    ]:
        expect_error(lambda: ok.cache_write(kv_c, k_pe, cache, np.array(slots, np.int32)), *patterns)
        np.testing.assert_array_equal(cache, before)
    expect_error(lambda: ok.cache_write(kv_c, k_pe[:, 1:], cache, np.arange(3, dtype=np.int32)), "'kv_cache'", "row width")
    expect_error(lambda: ok.cache_write(kv_c, k_pe[:2], cache, np.arange(3, dtype=np.int32)), "'k_pe'", "dimension 0")
    expect_error(lambda: ok.cache_write(kv_c, k_pe, cache, np.arange(2, dtype=np.int32)), "'slot_mapping'", "dimension 0")
    # (An f16 cache is not rejected by the kernel: onnxruntime, unlike OpenVINO's CPU plugin,
    # inserts no Convert, so it is written in place too; the contract still says f32 or bf16.)
    expect_error(lambda: ok.cache_write(kv_c, k_pe, cache.astype(np.float64), np.arange(3, dtype=np.int32)),
                 "'kv_cache'")
    expect_error(lambda: ok.cache_write(kv_c, k_pe, cache.view(np.uint8)[..., 1:], np.arange(3, dtype=np.int32)),
                 "'kv_cache'", "divisible by 2")
    expect_error(lambda: ok.cache_write(kv_c, k_pe, cache, np.array([0, 1, 2**40])), "'slot_mapping'",
                 "slot 1099511627776")  # i64 reaches the kernel unconverted
    np.testing.assert_array_equal(cache, before)


def test_thread_count_config_is_checked_and_results_do_not_depend_on_it(rng):
    so = ort.SessionOptions()
    so.add_session_config_entry(ok.THREADS_CONFIG_KEY, "zero")
    with pytest.raises(Exception, match="mla_export.num_threads"):
        so.register_custom_ops_library(ort_path())
    p = make_problem(rng, [1500, 3], [1, 1], 40, 16)
    q = randn(rng, (2, 3, 40))
    given = {**kernels.decode_form(q, 32), "kv_cache": p.kv_cache, "block_tables": p.block_tables, "seq_lens": p.seq_lens}
    names = [n for n, _ in ops.ordered_inputs("MlaPagedAttention", given)]
    feeds = {n: np.ascontiguousarray(given[n]) for n in names}
    model = ok.single_op_model([("MlaPagedAttention", names, {"scale": 0.2, "form": 1}, ["out"])],
                               [(n, a.dtype, a.ndim) for n, a in feeds.items()], [("out", np.float32, 3)])
    expected = ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.2, 32)
    for n in (1, 2, 7):
        sess = ort.InferenceSession(model.SerializeToString(), sess_options=ok.session_options(num_threads=n),
                                    providers=["CPUExecutionProvider"])
        assert rel_err(sess.run(None, feeds)[0], expected) <= TOL["f32"], f"num_threads={n}"


def ort_path() -> str:
    from mla_export import ort_ops_path

    return ort_ops_path()


def test_bf16_roundtrip_helpers(rng):
    a = randn(rng, (3, 5), "bf16")
    assert a.dtype == BF16
    np.testing.assert_array_equal(bits(ok.to_numpy(ok.ortvalue(a))), bits(a))
