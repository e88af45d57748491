"""MlaPagedAttention against the float64 reference, in both forms and mixed batches."""

import numpy as np
import pytest

from mla_export.ops import kernel_config, kernels
from mla_export.ops import reference as ref
from paged_problems import make_problem, randn, rel_err

TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1e-2}
DEEPSEEK = dict(h=16, dn=128, dr=64, r=512, dv=128)
SMALL = dict(h=3, dn=24, dr=16, r=32, dv=20)
ODD = dict(h=5, dn=10, dr=6, r=20, dv=12)
MINICPM3 = dict(h=40, dn=64, dr=32, r=256, dv=64)


def attention_args(rng, p, dims, act="f32", weight_dtype="f32") -> tuple:
    """paged_attention's inputs for problem p: random queries (act) and W_UK / W_UV (weight_dtype)."""
    h, dn, dr, r, dv = dims["h"], dims["dn"], dims["dr"], dims["r"], dims["dv"]
    t = int(p.qlens.sum())
    q_nope, q_pe = randn(rng, (t, h, dn), act), randn(rng, (t, h, dr), act)
    w_uk = randn(rng, (h, dn, r), weight_dtype, scale=dn ** -0.5)
    w_uv = randn(rng, (h, r, dv), weight_dtype, scale=r ** -0.5)
    return (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, (dn + dr) ** -0.5)


def run_case(rng, seq_lens, qlens, dims, bs=16, form="auto", act="f32", cache_dtype="f32", weight_dtype="f32"):
    h, dr, r, dv = dims["h"], dims["dr"], dims["r"], dims["dv"]
    p = make_problem(rng, seq_lens, qlens, r + dr, bs, cache_dtype)
    t = int(p.qlens.sum())
    args = attention_args(rng, p, dims, act, weight_dtype)
    out = kernels.paged_attention(*args, form=form)
    expected = ref.paged_attention_expanded(*args)
    assert out.shape == (t, h, dv) and out.dtype == args[0].dtype
    assert not np.isnan(out.astype(np.float32)).any(), "read a NaN-poisoned row no sequence owns"
    err = rel_err(out, expected)
    assert err <= TOL[act], f"form={form}: relative error {err:.3g} > {TOL[act]}"


@pytest.mark.parametrize("form", ["absorbed", "expanded", "auto"])
@pytest.mark.parametrize("prefix,new", [([0], [9]), ([64], [17]), ([0, 40, 128], [23, 5, 31])])
def test_extend_cases(rng, form, prefix, new):
    run_case(rng, np.add(prefix, new), new, DEEPSEEK, form=form, cache_dtype="bf16")


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_mixed_batch(rng, form):
    # decode, fresh prefill, chunked-prefill continuation, multi-token decode, empty query.
    seq_lens = [300, 57, 140, 9, 12]
    qlens = [1, 57, 40, 3, 0]
    run_case(rng, seq_lens, qlens, SMALL, form=form)


@pytest.mark.parametrize("block_size", [1, 16, 32, 64, 128])
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_block_sizes(rng, block_size, form):
    run_case(rng, [block_size + 5, 1, 130], [block_size + 5, 1, 7], ODD, bs=block_size, form=form)


@pytest.mark.parametrize("act", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("cache_dtype", ["f32", "bf16"])
def test_dtypes(rng, act, cache_dtype):
    run_case(rng, [33, 80], [33, 4], SMALL, act=act, cache_dtype=cache_dtype, weight_dtype=act, form="auto")


@pytest.mark.parametrize("dims", [DEEPSEEK, ODD], ids=["deepseek", "odd"])
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_bf16_weights_f32_exact(rng, dims, form):
    """bf16 W_UK / W_UV (a bf16 export feeds them as stored) with f32 activations and cache: the
    absorbed form widens them in registers (gemm_bf16b), the expanded form through an f32 view;
    both must match the float64 reference on the same bf16 values to f32 accuracy. Decode rows,
    a multi-token row run and NaN-poisoned free slots."""
    p = make_problem(rng, [70, 1, 19], [1, 1, 5], dims["r"] + dims["dr"], 16, "f32")
    args = attention_args(rng, p, dims, "f32", "bf16")
    out = kernels.paged_attention(*args, form=form)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    err = rel_err(out, ref.paged_attention_expanded(*args))
    assert err <= TOL["f32"], f"{form}: relative error {err:.3g}"


@pytest.mark.parametrize("dims", [DEEPSEEK, ODD, dict(MINICPM3, h=4, dv=84)], ids=["deepseek", "odd", "minicpm3-dv84"])
@pytest.mark.parametrize("seq_lens", [[70], [70, 3], [1, 130, 19]], ids=["1seq", "2seqs", "3seqs"])
def test_bf16_weights_decode_runs(rng, dims, seq_lens):
    """A decode batch of 1-3 sequences is a run of 1-3 rows per head: its bf16 up-projections walk
    W_UK / W_UV row by row (gemm_bf16b below a register tile's rows; one row on AVX-512 with the
    columns in register panels of 256, 128, 64 and 16, then scalars: 512 = 2 x 256, 256, 84 = 64 +
    16 + 4), ODD's widths leave a scalar tail. f32 activations and cache, NaN-poisoned free slots,
    against the float64 reference."""
    p = make_problem(rng, seq_lens, [1] * len(seq_lens), dims["r"] + dims["dr"], 16, "f32")
    args = attention_args(rng, p, dims, "f32", "bf16")
    out = kernels.paged_attention(*args, form="absorbed")
    assert out.dtype == np.float32 and not np.isnan(out).any()
    err = rel_err(out, ref.paged_attention_expanded(*args))
    assert err <= TOL["f32"], f"{len(seq_lens)} sequences: relative error {err:.3g}"


@pytest.mark.parametrize("h", [1, 128])
def test_head_counts(rng, h):
    run_case(rng, [20, 5], [6, 5], dict(SMALL, h=h))


def test_long_prefill_with_prefix_both_forms(rng):
    for form in ("absorbed", "expanded"):
        run_case(rng, [700], [300], SMALL, bs=32, form=form)


def _bf16_decode_expected() -> bool:
    """Whether decode rows multiply in bf16 here under compute="bf16": the kernel configuration's
    decode-rows engine is AMX tiles or AVX512-BF16 dots (tests/test_ops_isa.py checks that it is
    what the CPU has, and switches between them)."""
    return kernel_config.config().decode_rows != "f32"


@pytest.mark.parametrize("runtime", [rt for rt in kernels.RUNTIMES if kernels.available(rt)])
@pytest.mark.parametrize("h,cache_dtype,dims", [(16, "f16", DEEPSEEK), (16, "bf16", DEEPSEEK), (16, "f32", DEEPSEEK),
                                                (16, "int8", DEEPSEEK), (20, "f16", DEEPSEEK), (128, "f16", DEEPSEEK),
                                                (40, "f16", MINICPM3), (40, "bf16", MINICPM3)])
def test_bf16_compute_decode_rows(rng, runtime, h, cache_dtype, dims):
    """compute="bf16" (the runtime's bf16 hint): single-token rows multiply in bf16 with f32 sums
    on AMX tiles where the CPU has them (attention_amx.cpp), else in AVX512-BF16 dots where it has
    those (attention_bf16.cpp), every other row as under f32. Against the float64 reference at a
    bf16 tolerance: lengths around the 64-row chunk (odd ones: a row pair's lone last row) and a
    long one (split across threads), head counts that fill 16-row groups or not (20) and V3's 128,
    shuffled tables, NaN in every unowned row, one multi-token row run in the same call. Without
    either unit the result is the f32 one, bit for bit; with one, it must differ (the bf16 path ran).
    MiniCPM3's rows (256 + 32 wide) take the score tiles' runtime stride, DeepSeek's 576 its constant one."""
    dims = dict(dims, h=h)
    dr, r, dv = dims["dr"], dims["r"], dims["dv"]
    seq_lens, qlens = [1, 63, 64, 65, 1000, 37], [1, 1, 1, 1, 1, 4]
    p = make_problem(rng, seq_lens, qlens, r + dr, 16, cache_dtype, r=r)
    t = int(p.qlens.sum())
    args = attention_args(rng, p, dims, "f32", "bf16")
    kv = cache_dtype if cache_dtype == "int8" else None
    exact = kernels.paged_attention(*args, form="absorbed", kv_dtype=kv, num_threads=2, runtime=runtime)
    got = kernels.paged_attention(*args, form="absorbed", kv_dtype=kv, num_threads=2, compute="bf16", runtime=runtime)
    assert got.shape == (t, h, dv) and not np.isnan(got).any(), "read a NaN-poisoned row no sequence owns"
    expected = ref.paged_attention_expanded(*args, kv_dtype=kv)
    err = rel_err(got, expected)
    assert err <= TOL["bf16"], f"compute=bf16: relative error {err:.3g}"
    decode_rows, run_rows = got[:5], got[5:]
    np.testing.assert_array_equal(run_rows, exact[5:])  # multi-token rows keep the f32 kernels
    if _bf16_decode_expected():
        assert not np.array_equal(decode_rows, exact[:5]), "the bf16 decode path did not run on this CPU"
    else:
        np.testing.assert_array_equal(decode_rows, exact[:5])


def _bf16_prefill_expected() -> bool:
    """Whether the expanded form's products take AVX512-BF16 dots here under compute="bf16"
    (prefill_bf16.hpp): a bf16 or AMX decode-rows engine on a CPU with AVX512-BF16."""
    return kernel_config.config().decode_rows != "f32" and "avx512_bf16" in kernel_config.cpu_features()


@pytest.mark.parametrize("runtime", [rt for rt in kernels.RUNTIMES if kernels.available(rt)])
@pytest.mark.parametrize("dims,seq_lens,qlens", [
    (DEEPSEEK, [1, 2, 3, 63, 64, 65, 131], [1, 2, 3, 63, 64, 65, 131]),  # odd rows on the diagonal
    (DEEPSEEK, [600, 63], [600, 23]),  # two spans of 512 keys, and a prefix (40 cached, 23 new)
    (dict(DEEPSEEK, h=4, dv=48, dn=64, dr=32), [97, 150], [97, 70]),  # value width 48: 3 column blocks
    (SMALL, [80, 33], [80, 4]),  # value width 20: not in 16-column blocks, the f32 products
])
def test_bf16_compute_expanded_prefill(rng, runtime, dims, seq_lens, qlens):
    """compute="bf16": the expanded form (long prefills) scores and sums in AVX512-BF16 dots where
    the CPU has them, the keys and values of each span rounded to bf16 once. Against the float64
    reference at the bf16 tolerance, NaN in every unowned cache row; the first rows of a sequence
    see 1-3 keys, so a dropped or doubled key is an O(1) error there. Shapes whose value width is
    not in 16-column blocks, and CPUs without the dots, give the f32 result bit for bit."""
    p = make_problem(rng, seq_lens, qlens, dims["r"] + dims["dr"], 16, "f16", r=dims["r"])
    t = int(p.qlens.sum())
    args = attention_args(rng, p, dims, "f32", "f32")
    exact = kernels.paged_attention(*args, form="expanded", num_threads=2, runtime=runtime)
    got = kernels.paged_attention(*args, form="expanded", num_threads=2, compute="bf16", runtime=runtime)
    assert got.shape == (t, dims["h"], dims["dv"]) and not np.isnan(got).any(), "read a NaN-poisoned row"
    expected = ref.paged_attention_expanded(*args)
    # Two roundings to bf16 on the way (the latent rows and weights of the up-projections, then the
    # keys and values they give), as a bf16 matmul chain rounds: twice the single-rounding tolerance
    # of the decode rows (the worst of 40 seeds: 0.013)
    err = rel_err(got, expected)
    assert err <= 2 * TOL["bf16"], f"compute=bf16 expanded: relative error {err:.3g}"
    # each token on its own scale: bf16 rounding stays within a few percent (0.028 the worst seen),
    # a key dropped or counted twice among a first row's 1-3 visible keys moves it by a third or more
    worst = max(rel_err(got[i], expected[i]) for i in range(t))
    assert worst <= 0.1, f"compute=bf16 expanded: worst token's relative error {worst:.3g}"
    if _bf16_prefill_expected() and dims["dv"] % 16 == 0:
        assert not np.array_equal(got, exact), "the bf16 expanded products did not run on this CPU"
    else:
        np.testing.assert_array_equal(got, exact)


@pytest.mark.parametrize("block_size", [8, 32, 48])
def test_bf16_compute_decode_rows_block_sizes(rng, block_size):
    """The AMX path reads a bf16 cache's 16-row groups where they lie when the 16 rows are one
    block's (block sizes 16, 32, 48) and copies them otherwise (8: every group spans two blocks;
    a partial last group always): f32 reference at the bf16 tolerance, NaN in unowned rows. 20
    sequences: the decode run's up-projections (amx_up_project) take two token tiles, 16 and 4."""
    dims = DEEPSEEK
    seq_lens = [1, 15, 16, 17, 64, 100, 700] + [int(n) for n in rng.integers(1, 300, 13)]
    qlens = [1] * len(seq_lens)
    p = make_problem(rng, seq_lens, qlens, dims["r"] + dims["dr"], block_size, "bf16", r=dims["r"])
    args = attention_args(rng, p, dims, "f32", "bf16")
    got = kernels.paged_attention(*args, form="absorbed", num_threads=2, compute="bf16")
    assert not np.isnan(got).any(), "read a NaN-poisoned row no sequence owns"
    err = rel_err(got, ref.paged_attention_expanded(*args))
    assert err <= TOL["bf16"], f"block size {block_size}: relative error {err:.3g}"


def test_bf16_compute_attribute_checked(rng):
    p = make_problem(rng, [5], [1], 20 + 6, 4)
    args = (randn(rng, (1, 5, 10)), randn(rng, (1, 5, 6)), p.kv_cache, randn(rng, (5, 10, 20)), randn(rng, (5, 20, 12)),
            p.query_start_loc, p.seq_lens, p.block_tables, 0.3)
    with pytest.raises(ValueError, match="compute"):
        kernels.paged_attention(*args, compute="f16")
