"""Random paged-attention problems for the op tests: shuffled block tables, padded table
entries, and NaN in every cache row that no sequence owns (so a kernel that reads outside a
sequence's rows produces NaN and fails)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mla_export.formats.kv_formats import QUANTISED, encode_rows
from mla_export.ops.ov_tensors import BF16

DTYPES = {"f32": np.float32, "bf16": BF16, "f16": np.float16}


@dataclass
class PagedProblem:
    kv_cache: np.ndarray          # [NB, BS, W] (u8 [NB, BS, row bytes] for int8/fp8), NaN where unowned
    block_tables: np.ndarray      # [B, M] int32, shuffled ids; unused entries hold padding
    seq_lens: np.ndarray          # [B] int32
    query_start_loc: np.ndarray   # [B + 1] int32
    qlens: np.ndarray             # [B]


def make_problem(rng, seq_lens, qlens, width: int, block_size: int, cache_dtype="f32",
                 spare_blocks: int = 3, pad_value: int = -1, r: int | None = None) -> PagedProblem:
    """cache_dtype f32/bf16/f16, or int8/fp8 (then r, the latent rank, is needed): unowned
    int8/fp8 rows have a NaN scale, so reading one poisons the result as NaN does elsewhere."""
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    qlens = np.asarray(qlens, dtype=np.int32)
    assert np.all(qlens <= seq_lens)
    used = (seq_lens + block_size - 1) // block_size
    m = max(1, int(used.max(initial=0)) + 1)  # one spare column of padding
    nb = int(used.sum()) + spare_blocks
    perm = rng.permutation(nb).astype(np.int32)
    tables = np.full((len(seq_lens), m), pad_value, dtype=np.int32)
    owned = np.zeros((nb, block_size), dtype=bool)
    cursor = 0
    for b, (n_blocks, length) in enumerate(zip(used, seq_lens)):
        ids = perm[cursor:cursor + n_blocks]
        cursor += n_blocks
        tables[b, :n_blocks] = ids
        pos = np.arange(length)
        owned[ids[pos // block_size], pos % block_size] = True
    cache = rng.standard_normal((nb, block_size, width)).astype(np.float32)
    cache[~owned] = np.nan
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    if cache_dtype in QUANTISED:
        stored = encode_rows(cache.reshape(nb * block_size, width), cache_dtype, r).reshape(nb, block_size, -1)
    else:
        stored = cache.astype(DTYPES[cache_dtype])
    return PagedProblem(stored, tables, seq_lens, qsl, qlens)


def randn(rng, shape, dtype="f32", scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(DTYPES[dtype])


def rel_err(actual, expected) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.abs(actual - expected).max(initial=0.0) / max(np.abs(expected).max(initial=0.0), 1e-30))
