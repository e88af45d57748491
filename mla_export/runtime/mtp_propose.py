"""MTP drafts for speculative decoding (method "mtp"): the export's MTP draft graph run after
each main step (runtime/mtp_draft.py runs the graph; export/mtp.py and reference_mtp.py say
what it computes).

The draft's cache row at position p is the MTP layer fed (t_{p+1}, h_p): the main model's hidden
state at p and the token after it. After a step, each request's new positions s .. c-1 (c its
committed token count now: a prefill chunk's tokens, or a verify step's last sampled token and
its accepted drafts) have both: the main graph just returned h_s..h_{c-1} (`hidden_states`), and
t_{s+1}..t_c are known (t_c the token just sampled, or the prompt's next one). So:

1. catch-up: one draft run over all those rows of every request of the step (positions s..c-1,
   tokens t_{s+1}..t_c); it writes the draft rows of every committed position (a verify step's
   rows written from drafts before are overwritten) and its last row's logits give draft 1 (a
   guess of t_{c+1});
2. draft steps 2..k: one token each, the previous draft at position c + j - 2, fed the previous
   step's h' (as vLLM and DeepSeek run one MTP layer several times). Their rows lie past the
   committed tokens, so their slots are allocated first (the blocks the verify step would take
   anyway; without a free block the request drafts fewer tokens, never preempting anyone).

Drafts are the argmax of the draft logits: deterministic proposals, which the verifier's rejection
sampling keeps exact for sampled requests (spec_decode.py) and greedy verification makes output
identical to plain greedy decoding.

Prefix-cache hits: a draft row of a cached block's last position depends on the token after the
block, which its hash does not cover; the engine's KVCacheManager then stops a hit one token
short (draft_rows), so that position runs again and its draft row is rewritten for this request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .kv_cache import KVCacheManager
from .request import Request

__all__ = ["MTPProposer"]


@dataclass
class _Drafting:
    """A request drafting this step: its committed count c, drafts wanted, drafts so far, last h'."""

    req: Request
    committed: int
    wanted: int
    hidden: np.ndarray
    drafts: list[int] = field(default_factory=list)


class MTPProposer:
    def __init__(self, backend, kv_cache: KVCacheManager):
        self.backend, self.draft, self.kv = backend, backend.draft, kv_cache
        self.num_runs = 0  # draft graph runs (catch-up and draft steps)

    def propose(self, reqs: Sequence[Request], starts: Sequence[int], counts: Sequence[int],
                tables: Sequence[Sequence[int]], hidden: np.ndarray, wanted: Callable[[Request], int]) -> None:
        """After a main step over `reqs` (their new tokens from `starts`, `counts` rows each in
        `hidden`, `tables` their block tables when the step ran): the draft rows of every committed
        position, then up to wanted(req) drafts in req.spec_token_ids of each request that goes on.
        A request that failed this step (finish_reason "error") is left out."""
        rows, seqs = [], []
        first = 0
        for req, s, n, table in zip(reqs, starts, counts, tables):
            c = min(req.num_computed_tokens, req.num_tokens - 1)  # positions with a next token known
            if c > s and req.finish_reason != "error":
                rows.append(np.arange(first, first + c - s))
                seqs.append((req, s, c, table))
            first += n
        if not seqs:
            return
        meta = self.backend.build([c for _, _, c, _ in seqs], [c - s for _, s, c, _ in seqs],
                                  [t for *_, t in seqs], [r.all_token_ids[s + 1:c + 1] for r, s, c, _ in seqs])
        logits, h = self._run(meta, hidden[np.concatenate(rows)])
        # Who drafts: running requests whose next token to run is the one just sampled (t_c).
        going: list[_Drafting] = []
        for j, (req, s, c, _) in enumerate(seqs):
            k = wanted(req) if req.num_tokens == c + 1 else 0
            if k >= 1:
                if k > 1 and not self.kv.allocate_slots(req.request_id, c, k - 1):
                    k = 1  # no free block for the later drafts' rows: one draft (its row is at c - 1)
                going.append(_Drafting(req, c, k, h[j], [int(np.argmax(logits[j]))]))
        copies = self.kv.take_block_copies()  # none expected (the blocks past c are private); applied first
        if copies:
            self.backend.apply_block_copies(copies)
        step = 1  # draft step+1 runs draft `step` at position c + step - 1
        while more := [g for g in going if g.wanted > step]:
            meta = self.backend.build([g.committed + step for g in more], [1] * len(more),
                                      [self.kv.block_table(g.req.request_id) for g in more],
                                      [[g.drafts[-1]] for g in more])
            logits, h = self._run(meta, np.stack([g.hidden for g in more]))
            for j, g in enumerate(more):
                g.drafts.append(int(np.argmax(logits[j])))
                g.hidden = h[j]
            step += 1
        for g in going:
            g.req.spec_token_ids = g.drafts

    def _run(self, meta, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.num_runs += 1
        return self.draft.run(meta, hidden)
