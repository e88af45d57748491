"""The attention metadata of one step: per-sequence facts -> the graph's packed inputs.

This is the metadata builder of the backend (vLLM's `AttentionMetadataBuilder` role). A step
packs the new tokens of B sequences along one token axis T. For sequence b the caller gives:
  - seq_lens[b]    all its tokens once this step has run (cached ones + the new ones),
  - query_lens[b]  how many of them are new in this step (1 for a decode, a chunk for a prefill),
  - block_table[b] the physical blocks holding its tokens, in token order,
  - its new token ids (query_lens[b] of them).
From these it derives every index the graph needs (see MLA.md, "The paged latent cache"):
  query_start_loc = [0, cumsum(query_lens)]
  positions[t]    = seq_lens[b] - query_lens[b] + j       for new token j of sequence b
  slot_mapping[t] = block_table[b][pos // BS] * BS + pos % BS
  logits_indices  = query_start_loc[1:] - 1                (the last new token of each sequence)
  block_tables    = the tables padded with 0 to the batch's widest needed width
Everything is computed with whole-array numpy operations; the only Python loop runs over the
B sequences (to pack their ragged tables), never over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

__all__ = ["MLAMetadata", "MLAMetadataBuilder"]

# The graph inputs carried by the metadata, in the contract's order (the caches are bound separately).
METADATA_INPUTS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "query_start_loc",
    "seq_lens",
    "block_tables",
    "logits_indices",
)


@dataclass(frozen=True)
class MLAMetadata:
    """The graph inputs of one step, all C-contiguous int32 (the contract's metadata dtype)."""

    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    query_start_loc: np.ndarray  # [B + 1]
    seq_lens: np.ndarray  # [B]
    block_tables: np.ndarray  # [B, M]
    logits_indices: np.ndarray  # [B]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def feeds(self) -> dict[str, np.ndarray]:
        """name -> array, ready to be bound to the graph's inputs."""
        return {name: getattr(self, name) for name in METADATA_INPUTS}


def _int32_vector(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int32)


class MLAMetadataBuilder:
    """Builds and validates `MLAMetadata` for a cache of `num_blocks` blocks of `block_size` rows.

    `max_model_len` bounds seq_lens (the model's context); `vocab_size`, when given, bounds the
    token ids. Validation errors are ValueError with the offending sequence named, because a bad
    index here would make the graph read or write outside a sequence's blocks.
    """

    def __init__(self, block_size: int, num_blocks: int, max_model_len: int, vocab_size: int | None = None):
        if block_size < 1 or num_blocks < 1 or max_model_len < 1:
            raise ValueError("block_size, num_blocks and max_model_len must be positive")
        if num_blocks * block_size > np.iinfo(np.int32).max:
            raise ValueError("num_blocks * block_size must fit the graph's int32 slot_mapping")
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        self.max_model_len = int(max_model_len)
        self.vocab_size = None if vocab_size is None else int(vocab_size)

    def build(
        self,
        seq_lens: Sequence[int] | np.ndarray,
        query_lens: Sequence[int] | np.ndarray,
        block_tables: Sequence[Sequence[int]],
        new_token_ids: Sequence[Sequence[int]] | np.ndarray,
    ) -> MLAMetadata:
        """`new_token_ids` is either one sequence of ids per sequence or the packed [T] array.

        This runs once per step on the hot path, so it keeps the number of numpy calls small:
        one combined validity mask (explained in detail only when it fails) and a shortcut for
        pure decode steps (every query_len 1), where token t is sequence t.
        """
        bs = self.block_size
        seq_lens = _int32_vector(seq_lens, "seq_lens")
        query_lens = _int32_vector(query_lens, "query_lens")
        num_seqs = seq_lens.shape[0]
        if num_seqs == 0:
            raise ValueError("a step needs at least one sequence")
        if query_lens.shape[0] != num_seqs or len(block_tables) != num_seqs:
            raise ValueError(
                f"seq_lens ({num_seqs}), query_lens ({query_lens.shape[0]}) and block_tables "
                f"({len(block_tables)}) must describe the same sequences"
            )
        # Each sequence needs ceil(seq_len / BS) blocks.
        needed = (seq_lens + (bs - 1)) // bs
        table_lens = np.fromiter(map(len, block_tables), dtype=np.int64, count=num_seqs)
        bad = (query_lens < 1) | (query_lens > seq_lens) | (seq_lens > self.max_model_len) | (table_lens < needed)
        if bad.any():
            self._explain(seq_lens, query_lens, table_lens, needed)

        # Block tables padded with 0 to the widest (a valid block id the kernels never read,
        # since they stop at seq_len).
        width = int(needed.max())
        total = int(needed.sum())
        flat = np.fromiter(
            chain.from_iterable(t[:n] for t, n in zip(block_tables, needed.tolist())), dtype=np.int64, count=total
        )
        if flat.min() < 0 or flat.max() >= self.num_blocks:
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}); got {flat.min()}..{flat.max()}")
        if total == num_seqs * width:  # no padding needed (e.g. a decode batch in step)
            tables = flat.astype(np.int32).reshape(num_seqs, width)
        else:
            tables = np.zeros((num_seqs, width), dtype=np.int32)
            tables[np.arange(width) < needed[:, None]] = flat

        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        if num_tokens == num_seqs:  # all query_lens are 1 (each is >= 1)
            seq_of_token = np.arange(num_seqs)
            positions = seq_lens - 1
        else:  # which sequence each packed token belongs to, and its index j within the chunk
            seq_of_token = np.repeat(np.arange(num_seqs), query_lens)
            j = np.arange(num_tokens, dtype=np.int32) - query_start_loc[:-1][seq_of_token]
            positions = (seq_lens - query_lens)[seq_of_token] + j
        # int32 cannot overflow: __init__ checked num_blocks * block_size.
        slot_mapping = tables[seq_of_token, positions // bs] * bs + positions % bs

        return MLAMetadata(
            input_ids=self._pack_token_ids(new_token_ids, query_lens, num_tokens),
            positions=positions,
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=tables,
            logits_indices=query_start_loc[1:] - 1,
        )

    def _pack_token_ids(self, new_token_ids, query_lens: np.ndarray, num_tokens: int) -> np.ndarray:
        if isinstance(new_token_ids, np.ndarray):
            packed = _int32_vector(new_token_ids, "new_token_ids")
            if packed.shape[0] != num_tokens:
                raise ValueError(f"expected {num_tokens} packed new token ids, got {packed.shape[0]}")
        else:
            num_seqs = query_lens.shape[0]
            lens = np.fromiter(map(len, new_token_ids), dtype=np.int64, count=len(new_token_ids))
            if lens.shape[0] != num_seqs or (lens != query_lens).any():
                raise ValueError(f"new_token_ids must hold query_lens {query_lens.tolist()} ids, got {lens.tolist()}")
            packed = np.fromiter(chain.from_iterable(new_token_ids), dtype=np.int64, count=num_tokens)
        upper = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        if packed.min() < 0 or packed.max() >= upper:
            raise ValueError(f"token ids must lie in [0, {upper}); got {packed.min()}..{packed.max()}")
        return packed.astype(np.int32, copy=False)

    def _explain(self, seq_lens, query_lens, table_lens, needed) -> None:
        """Raise for the first sequence that failed the combined check, saying why."""
        for what, bad, values in (
            ("has no new token (query_len < 1)", query_lens < 1, query_lens),
            ("has query_len > seq_len", query_lens > seq_lens, query_lens),
            (f"is longer than the model's context ({self.max_model_len})", seq_lens > self.max_model_len, seq_lens),
            ("has a block table shorter than its seq_len needs", table_lens < needed, table_lens),
        ):
            if bad.any():
                b = int(np.flatnonzero(bad)[0])
                raise ValueError(f"sequence {b} {what} (value {int(values[b])})")
