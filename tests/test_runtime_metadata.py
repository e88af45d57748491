"""The metadata builder: hand-computed cases, a per-token loop oracle on random batches, and errors."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime.metadata import METADATA_INPUTS, MLAMetadataBuilder


def test_hand_computed_mixed_batch():
    # block size 4; a chunked-prefill continuation, a fresh prefill and a decode in one step.
    builder = MLAMetadataBuilder(block_size=4, num_blocks=8, max_model_len=64, vocab_size=100)
    md = builder.build(
        seq_lens=[6, 3, 9],
        query_lens=[2, 3, 1],
        block_tables=[[7, 2], [5], [1, 0, 3, 6]],  # the last table is longer than needed
        new_token_ids=[[11, 12], [21, 22, 23], [31]],
    )
    assert md.input_ids.tolist() == [11, 12, 21, 22, 23, 31]
    assert md.positions.tolist() == [4, 5, 0, 1, 2, 8]
    # pos 4,5 -> block 2 offsets 0,1; pos 0..2 -> block 5; pos 8 -> block 3 offset 0
    assert md.slot_mapping.tolist() == [8, 9, 20, 21, 22, 12]
    assert md.query_start_loc.tolist() == [0, 2, 5, 6]
    assert md.seq_lens.tolist() == [6, 3, 9]
    assert md.block_tables.tolist() == [[7, 2, 0], [5, 0, 0], [1, 0, 3]]
    assert md.logits_indices.tolist() == [1, 4, 5]
    assert (md.num_tokens, md.num_seqs) == (6, 3)
    feeds = md.feeds()
    assert list(feeds) == list(METADATA_INPUTS)
    for arr in feeds.values():
        assert arr.dtype == np.int32 and arr.flags.c_contiguous


def _loop_oracle(bs, seq_lens, query_lens, tables):
    positions, slots = [], []
    for s, q, table in zip(seq_lens, query_lens, tables):
        for j in range(q):
            pos = s - q + j
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
    return positions, slots


def test_random_batches_match_a_per_token_loop(rng):
    for _ in range(20):
        bs = int(rng.integers(1, 9))
        num_blocks = 6 * 60  # enough for 6 sequences of 59 tokens at block size 1
        b = int(rng.integers(1, 7))
        seq_lens = rng.integers(1, 60, size=b)
        query_lens = np.array([rng.integers(1, s + 1) for s in seq_lens])
        perm = rng.permutation(num_blocks)
        tables, used = [], 0
        for s in seq_lens:
            n = -(-int(s) // bs)
            tables.append(perm[used : used + n].tolist())
            used += n
        tokens = rng.integers(0, 50, size=int(query_lens.sum()))
        builder = MLAMetadataBuilder(bs, num_blocks, max_model_len=64)
        md = builder.build(seq_lens, query_lens, tables, tokens)
        positions, slots = _loop_oracle(bs, seq_lens, query_lens, tables)
        assert md.positions.tolist() == positions
        assert md.slot_mapping.tolist() == slots
        assert md.input_ids.tolist() == tokens.tolist()
        assert md.logits_indices.tolist() == (np.cumsum(query_lens) - 1).tolist()
        width = max(len(t) for t in tables)
        assert md.block_tables.shape == (b, width)
        for row, table in zip(md.block_tables.tolist(), tables):
            assert row[: len(table)] == table and all(x == 0 for x in row[len(table) :])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seq_lens=[4], query_lens=[0], block_tables=[[0]], new_token_ids=[[]]), "no new token"),
        (dict(seq_lens=[2], query_lens=[3], block_tables=[[0]], new_token_ids=[[1, 2, 3]]), "query_len > seq_len"),
        (dict(seq_lens=[65], query_lens=[1], block_tables=[list(range(17))], new_token_ids=[[1]]), "context"),
        (dict(seq_lens=[5], query_lens=[1], block_tables=[[0]], new_token_ids=[[1]]), "block table shorter"),
        (dict(seq_lens=[3], query_lens=[1], block_tables=[[8]], new_token_ids=[[1]]), "block ids"),
        (dict(seq_lens=[3], query_lens=[2], block_tables=[[1]], new_token_ids=[[1]]), "new_token_ids must hold"),
        (dict(seq_lens=[3], query_lens=[1], block_tables=[[1]], new_token_ids=[[100]]), "token ids must lie"),
        (dict(seq_lens=[3, 4], query_lens=[1], block_tables=[[1]], new_token_ids=[[1]]), "same sequences"),
        (dict(seq_lens=[], query_lens=[], block_tables=[], new_token_ids=[]), "at least one"),
        (dict(seq_lens=[3.0], query_lens=[1], block_tables=[[1]], new_token_ids=[[1]]), "integers"),
    ],
)
def test_bad_inputs_are_rejected(kwargs, message):
    builder = MLAMetadataBuilder(block_size=4, num_blocks=8, max_model_len=64, vocab_size=100)
    with pytest.raises(ValueError, match=message):
        builder.build(**kwargs)


def test_hand_computed_decode_step():
    # The decode shortcut (every query_len 1): token b is sequence b.
    builder = MLAMetadataBuilder(block_size=4, num_blocks=8, max_model_len=64, vocab_size=100)
    md = builder.build(seq_lens=[5, 9], query_lens=[1, 1], block_tables=[[3, 1], [0, 2, 4]], new_token_ids=[[7], [8]])
    assert md.positions.tolist() == [4, 8]
    assert md.slot_mapping.tolist() == [1 * 4 + 0, 4 * 4 + 0]
    assert md.block_tables.tolist() == [[3, 1, 0], [0, 2, 4]]
    assert md.query_start_loc.tolist() == [0, 1, 2] and md.logits_indices.tolist() == [0, 1]
    assert md.input_ids.tolist() == [7, 8]
    for arr in md.feeds().values():
        assert arr.dtype == np.int32 and arr.flags.c_contiguous


class TestIdsBeyondInt32AreRefusedBeforeTheCast:
    """Cause: the builder cast packed int64 token ids to int32 before checking them (2**32 + 3 ran
    as token 3), and a Python int beyond int32 in a list raised numpy's OverflowError, naming no
    input. The builder is the one check of these values on the engine's path (docs/SAFETY.md)."""

    def _builder(self):
        return MLAMetadataBuilder(block_size=4, num_blocks=8, max_model_len=64, vocab_size=100)

    def test_packed_int64_token_id(self):
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 100\); got 4294967299"):
            self._builder().build([1], [1], [[1]], np.array([2**32 + 3], dtype=np.int64))

    @pytest.mark.parametrize("where", ["block_tables", "new_token_ids"])
    def test_python_int_beyond_int32(self, where):
        tables, ids = ([[2**32 + 1]], [[1]]) if where == "block_tables" else ([[1]], [[2**32 + 3]])
        with pytest.raises(ValueError, match=f"^{where}: .* out of bounds for int32"):
            self._builder().build([1], [1], tables, ids)
