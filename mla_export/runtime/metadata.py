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


def _as_int_vector(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class MLAMetadataBuilder:
    """Builds and validates `MLAMetadata` for a cache of `num_blocks` blocks of `block_size` rows.

    `max_model_len` bounds seq_lens (the model's context); `vocab_size`, when given, bounds the
    token ids. Validation errors are ValueError with the offending sequence named, because a bad
    index here would make the graph read or write outside a sequence's blocks.
    """

    def __init__(self, block_size: int, num_blocks: int, max_model_len: int, vocab_size: int | None = None):
        if block_size < 1 or num_blocks < 1 or max_model_len < 1:
            raise ValueError("block_size, num_blocks and max_model_len must be positive")
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
        """`new_token_ids` is either one sequence of ids per sequence or the packed [T] array."""
        bs = self.block_size
        seq_lens = _as_int_vector(seq_lens, "seq_lens")
        query_lens = _as_int_vector(query_lens, "query_lens")
        num_seqs = seq_lens.shape[0]
        if num_seqs == 0:
            raise ValueError("a step needs at least one sequence")
        if query_lens.shape[0] != num_seqs or len(block_tables) != num_seqs:
            raise ValueError(
                f"seq_lens ({num_seqs}), query_lens ({query_lens.shape[0]}) and block_tables "
                f"({len(block_tables)}) must describe the same sequences"
            )
        self._check_per_sequence(
            (query_lens < 1), "has no new token (query_len < 1)", query_lens
        )
        self._check_per_sequence((query_lens > seq_lens), "has query_len > seq_len", query_lens)
        self._check_per_sequence(
            (seq_lens > self.max_model_len), f"is longer than the model's context ({self.max_model_len})", seq_lens
        )

        # Block tables: each sequence needs ceil(seq_len / BS) blocks; pad to the widest with 0
        # (a valid block id that the kernels never read past seq_len).
        needed = (seq_lens + bs - 1) // bs
        width = int(needed.max())
        table_lens = np.fromiter((len(t) for t in block_tables), dtype=np.int64, count=num_seqs)
        self._check_per_sequence(table_lens < needed, "has a block table shorter than its seq_len needs", table_lens)
        flat_blocks = np.concatenate(
            [np.asarray(t[:n], dtype=np.int64) for t, n in zip(block_tables, needed.tolist())]
        )
        if flat_blocks.size and (flat_blocks.min() < 0 or flat_blocks.max() >= self.num_blocks):
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}); got {flat_blocks.min()}..{flat_blocks.max()}")
        tables = np.zeros((num_seqs, width), dtype=np.int32)
        tables[np.arange(width)[None, :] < needed[:, None]] = flat_blocks

        # Token axis: which sequence each packed token belongs to and its index j within the chunk.
        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        seq_of_token = np.repeat(np.arange(num_seqs), query_lens)
        j = np.arange(num_tokens) - query_start_loc[:-1][seq_of_token]
        positions = (seq_lens - query_lens)[seq_of_token] + j
        slot_mapping = tables[seq_of_token, positions // bs].astype(np.int64) * bs + positions % bs

        input_ids = self._pack_token_ids(new_token_ids, query_lens, num_tokens)

        return MLAMetadata(
            input_ids=input_ids,
            positions=positions.astype(np.int32),
            slot_mapping=slot_mapping.astype(np.int32),
            query_start_loc=query_start_loc.astype(np.int32),
            seq_lens=seq_lens.astype(np.int32),
            block_tables=tables,
            logits_indices=(query_start_loc[1:] - 1).astype(np.int32),
        )

    def _pack_token_ids(self, new_token_ids, query_lens: np.ndarray, num_tokens: int) -> np.ndarray:
        if isinstance(new_token_ids, np.ndarray) and new_token_ids.ndim == 1:
            packed = new_token_ids
        else:
            if len(new_token_ids) != query_lens.shape[0]:
                raise ValueError("new_token_ids must give the new tokens of every sequence")
            lens = np.fromiter((len(t) for t in new_token_ids), dtype=np.int64, count=len(new_token_ids))
            self._check_per_sequence(lens != query_lens, "has a number of new token ids != its query_len", lens)
            packed = np.concatenate([np.asarray(t, dtype=np.int64) for t in new_token_ids])
        if packed.shape != (num_tokens,):
            raise ValueError(f"expected {num_tokens} packed new token ids, got shape {packed.shape}")
        if packed.size and not np.issubdtype(packed.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got {packed.dtype}")
        upper = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        if packed.size and (packed.min() < 0 or packed.max() >= upper):
            raise ValueError(f"token ids must lie in [0, {upper}); got {packed.min()}..{packed.max()}")
        return np.ascontiguousarray(packed, dtype=np.int32)

    @staticmethod
    def _check_per_sequence(bad: np.ndarray, what: str, values: np.ndarray) -> None:
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sequence {b} {what} (value {int(values[b])})")
