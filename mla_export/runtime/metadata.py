"""The attention metadata of one step: per-sequence facts -> the graph's packed inputs.

This is the metadata builder of the backend (vLLM's `AttentionMetadataBuilder` role). A step
packs the new tokens of B sequences along one token axis T. For sequence b the caller gives:
  - seq_lens[b]    all its tokens once this step has run (cached ones + the new ones),
  - query_lens[b]  how many of them are new in this step (1 for a decode, a chunk for a prefill),
  - block_table[b] the physical blocks holding its tokens, in token order,
  - its new token ids (query_lens[b] of them).
From these it derives every index the graph needs (see docs/MLA.md, "The paged latent cache"):
  query_start_loc = [0, cumsum(query_lens)]
  positions[t]    = seq_lens[b] - query_lens[b] + j       for new token j of sequence b
  slot_mapping[t] = block_table[b][pos // BS] * BS + pos % BS
  logits_indices  = query_start_loc[1:] - 1                (the last new token of each sequence;
                    with num_logits[b] > 1 its last num_logits[b] new tokens: prompt logprobs)
  block_tables    = the tables padded with 0 to the batch's widest needed width (or to the
                    fixed width of the executor's static decode graphs, `table_width`)
Everything is computed with whole-array numpy operations; the only Python loop runs over the
B sequences (to pack their ragged tables), never over tokens.

Where the values land: `build(..., out=buffers)` writes every array into the int32 arrays that
`buffers` hands out. The backend passes its executor's own input arrays (executor_common.py
`MetadataTensors`), which the graph reads in place: a step's metadata is written once, where
it is consumed (as OpenVINO GenAI's pipelines fill their infer request's input tensors), and no
second pass checks or copies it (docs/SAFETY.md, "Which check holds which invariant"). Without
`out` the arrays are fresh (tools, tests, the start-up sentinel step).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

__all__ = ["MLAMetadata", "MLAMetadataBuilder", "MetadataBuffers", "METADATA_INPUTS"]

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
    logits_indices: np.ndarray  # [L] (L = B unless some sequence returns more rows)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def feeds(self) -> dict[str, np.ndarray]:
        """name -> array, ready to be bound to the graph's inputs."""
        return {name: getattr(self, name) for name in METADATA_INPUTS}


class MetadataBuffers:
    """Where a build puts its arrays: `array(name, shape)` returns a writable C-contiguous int32
    array of that shape for the metadata input `name` (its old values are overwritten). This
    base class returns fresh arrays; an executor's subclass returns its own input arrays."""

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, dtype=np.int32)

    def table_width(self, num_seqs: int, num_tokens: int, needed: int) -> int:
        """The block_tables width of a step whose widest sequence needs `needed` blocks: that
        width here; an executor with graphs of a fixed width answers theirs for the steps
        those graphs run (the extra columns are 0, a block id no kernel reads)."""
        return needed


_FRESH = MetadataBuffers()


def _int_list(values, name: str) -> list[int]:
    """Per-sequence integers as a Python list (cheap to check for a handful of sequences)."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise ValueError(f"{name} must be a one-dimensional integer array, got {values.dtype} {values.shape}")
        return values.tolist()
    values = list(values)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must hold integers")
    return values


def _int32_from(values, count: int, name: str, rule: str) -> np.ndarray:
    """The integers as an int32 array; a value int32 cannot hold is refused, not wrapped."""
    try:
        return np.fromiter(values, dtype=np.int32, count=count)
    except OverflowError as e:  # numpy: "Python integer ... out of bounds for int32"
        raise ValueError(f"{name}: {rule}; {e}") from None


def _out_of_range(arr: np.ndarray, upper: int) -> bool:
    """Any value outside [0, upper) in an int32 array, with one reduction: viewed as uint32, a
    negative value is >= 2**31 > upper."""
    return arr.size > 0 and int(arr.view(np.uint32).max()) >= upper


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
        num_logits: Sequence[int] | None = None,
        out: MetadataBuffers | None = None,
    ) -> MLAMetadata:
        """`new_token_ids` is either one sequence of ids per sequence or the packed [T] array.
        `num_logits[b]` (default 1): how many of sequence b's new tokens, the last ones, return
        logits rows (in order); more than one for the prompt logprobs of a prefill chunk.
        `out`: where the arrays are written (MetadataBuffers; default fresh arrays). The returned
        metadata then holds `out`'s arrays: valid until the next build into the same `out`.

        This runs once per step on the hot path. Numpy's per-call cost dominates at decode batch
        sizes, so the per-sequence facts (B values) are checked with Python builtins, and numpy
        does the per-token work (T values) in a few whole-array operations.
        """
        bs = self.block_size
        seq_lens = _int_list(seq_lens, "seq_lens")
        query_lens = _int_list(query_lens, "query_lens")
        num_seqs = len(seq_lens)
        if num_seqs == 0:
            raise ValueError("a step needs at least one sequence")
        if len(query_lens) != num_seqs or len(block_tables) != num_seqs:
            raise ValueError(
                f"seq_lens ({num_seqs}), query_lens ({len(query_lens)}) and block_tables "
                f"({len(block_tables)}) must describe the same sequences"
            )
        needed = [-(-s // bs) for s in seq_lens]  # blocks each sequence reads: ceil(seq_len / BS)
        if (
            min(query_lens) < 1
            or max(seq_lens) > self.max_model_len
            or any(q > s for q, s in zip(query_lens, seq_lens))
            or any(len(t) < n for t, n in zip(block_tables, needed))
        ):
            self._explain(seq_lens, query_lens, block_tables, needed)

        buf = _FRESH if out is None else out
        # Block tables padded with 0 to the widest (a valid block id the kernels never read,
        # since they stop at seq_len).
        num_tokens = sum(query_lens)
        width, total = max(needed), sum(needed)
        width = max(width, buf.table_width(num_seqs, num_tokens, width))
        flat = _int32_from(chain.from_iterable(t[:n] for t, n in zip(block_tables, needed)), total,
                           "block_tables", f"block ids must lie in [0, {self.num_blocks})")
        if _out_of_range(flat, self.num_blocks):
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}); got {flat.min()}..{flat.max()}")
        input_ids = self._pack_token_ids(new_token_ids, query_lens, num_tokens, buf)
        tables = buf.array("block_tables", (num_seqs, width))
        if total == num_seqs * width:  # every table has the same width: no padding
            tables.reshape(-1)[:] = flat
        elif num_seqs == 1:
            tables[0, :total] = flat
            tables[0, total:] = 0
        else:
            tables.fill(0)
            tables[np.arange(width) < np.array(needed)[:, None]] = flat

        seq_lens_arr = buf.array("seq_lens", (num_seqs,))
        seq_lens_arr[:] = seq_lens
        query_start_loc = buf.array("query_start_loc", (num_seqs + 1,))
        positions = buf.array("positions", (num_tokens,))
        if num_tokens == num_seqs:  # a pure decode step (each query_len is >= 1): token b is sequence b
            query_start_loc[:] = np.arange(num_seqs + 1, dtype=np.int32)
            seq_of_token = query_start_loc[:-1]
            np.subtract(seq_lens_arr, 1, out=positions)
        else:  # which sequence each packed token belongs to, and its index j within the chunk
            query_lens_arr = np.array(query_lens, dtype=np.int32)
            query_start_loc[0] = 0
            np.cumsum(query_lens_arr, out=query_start_loc[1:])
            seq_of_token = np.repeat(np.arange(num_seqs), query_lens_arr)
            j = np.arange(num_tokens, dtype=np.int32) - query_start_loc[:-1][seq_of_token]
            np.add((seq_lens_arr - query_lens_arr)[seq_of_token], j, out=positions)
        # int32 cannot overflow: __init__ checked num_blocks * block_size.
        slot_mapping = buf.array("slot_mapping", (num_tokens,))
        np.multiply(tables[seq_of_token, positions // bs], bs, out=slot_mapping)
        slot_mapping += positions % bs

        return MLAMetadata(
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens_arr,
            block_tables=tables,
            logits_indices=self._logits_indices(query_start_loc, query_lens, num_logits, buf),
        )

    @staticmethod
    def _logits_indices(query_start_loc: np.ndarray, query_lens: list[int], num_logits,
                        buf: MetadataBuffers) -> np.ndarray:
        counts = None if num_logits is None else _int_list(num_logits, "num_logits")
        if counts is not None:
            if len(counts) != len(query_lens):
                raise ValueError(f"num_logits must have one count per sequence ({len(query_lens)}), got {len(counts)}")
            for b, (c, q) in enumerate(zip(counts, query_lens)):
                if not 1 <= c <= q:
                    raise ValueError(f"num_logits[{b}] must lie in [1, {q}] (the sequence's new tokens), got {c}")
            if all(c == 1 for c in counts):
                counts = None
        if counts is None:  # each sequence's last new token
            out = buf.array("logits_indices", (len(query_lens),))
            np.subtract(query_start_loc[1:], 1, out=out)
            return out
        counts_arr = np.array(counts, dtype=np.int32)
        last = query_start_loc[1:] - 1
        starts = np.repeat(last + 1 - counts_arr, counts_arr)  # each run's first row, per returned row
        run_start = np.repeat(np.cumsum(counts_arr) - counts_arr, counts_arr)
        out = buf.array("logits_indices", (int(counts_arr.sum()),))
        np.add(starts, np.arange(out.shape[0], dtype=np.int32) - run_start, out=out, casting="unsafe")
        return out

    def _pack_token_ids(self, new_token_ids, query_lens: list[int], num_tokens: int,
                        buf: MetadataBuffers) -> np.ndarray:
        upper = self.vocab_size if self.vocab_size is not None else np.iinfo(np.int32).max
        if isinstance(new_token_ids, np.ndarray):
            if new_token_ids.shape != (num_tokens,) or new_token_ids.dtype.kind not in "iu":
                raise ValueError(f"expected {num_tokens} packed integer token ids, got {new_token_ids.dtype} "
                                 f"{new_token_ids.shape}")
            # checked in its own dtype: a cast first would turn an int64 id of 2**32 + k into k
            if new_token_ids.size and (int(new_token_ids.min()) < 0 or int(new_token_ids.max()) >= upper):
                raise ValueError(f"token ids must lie in [0, {upper}); got {new_token_ids.min()}..{new_token_ids.max()}")
            packed = buf.array("input_ids", (num_tokens,))
            packed[:] = new_token_ids
            return packed
        lens = [len(t) for t in new_token_ids]
        if lens != query_lens:
            raise ValueError(f"new_token_ids must hold query_lens {query_lens} ids, got {lens}")
        flat = _int32_from(chain.from_iterable(new_token_ids), num_tokens, "new_token_ids",
                           f"token ids must lie in [0, {upper})")
        if _out_of_range(flat, upper):
            raise ValueError(f"token ids must lie in [0, {upper}); got {flat.min()}..{flat.max()}")
        packed = buf.array("input_ids", (num_tokens,))
        packed[:] = flat
        return packed

    def _explain(self, seq_lens, query_lens, block_tables, needed) -> None:
        """Raise for the first sequence that failed the checks, saying why."""
        for b, (s, q, t, n) in enumerate(zip(seq_lens, query_lens, block_tables, needed)):
            for bad, what, value in (
                (q < 1, "has no new token (query_len < 1)", q),
                (q > s, "has query_len > seq_len", q),
                (s > self.max_model_len, f"is longer than the model's context ({self.max_model_len})", s),
                (len(t) < n, "has a block table shorter than its seq_len needs", len(t)),
            ):
                if bad:
                    raise ValueError(f"sequence {b} {what} (value {value})")
