"""What the ingress sends an engine replica and what comes back.

A call is one HTTP generation request: its sequences (n choices of one or more prompts) go to
one replica together, so the choices share the prompt's prefix-cached blocks. The call is a
Ray Serve streaming call (routed, counted, cancelled and drained by Ray Serve; pickled by Ray)
whose stream carries only its control messages:

    ("accepted", replica_id, channel_address)   first, once the sequences are in its engine
    ("rejected", kind, message)                 or instead: kind in REJECT_KINDS
    ("stats", snapshot)                         last, once every sequence ended: the replica's stats

The outputs themselves (`Delta` / `Aborted`, the items every engine client yields: deltas.py)
travel on the replica's output channel to that ingress (channel.py): one frame per engine step
for all of the ingress's calls on the replica, each item encoded by `to_wire` as a JSON list and
handed to the HTTP layer as it came (nothing is accumulated at the far end).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..deltas import Delta, delta_of
from ..engine_loop import Aborted

__all__ = ["EngineCall", "REJECT_KINDS", "Delta", "delta_of", "to_wire", "from_wire"]

REJECT_KINDS = ("queue_full", "shutting_down", "engine_dead", "invalid")


@dataclass
class EngineCall:
    seqs: list  # SeqRequest
    channel: str = ""  # the calling ingress's channel token: where the replica sends the outputs

    @property
    def prompt_ids(self) -> list[int]:
        """The first sequence's prompt token ids: what the router matches on."""
        p = self.seqs[0].prompt if self.seqs else []
        return list(p) if isinstance(p, (list, tuple)) else []


def to_wire(item) -> list:
    """One output as a JSON-able list: ["d", Delta fields...] or ["a", request_id, reason, error]."""
    if isinstance(item, Aborted):
        return ["a", item.request_id, item.reason, item.error]
    d = item if isinstance(item, Delta) else delta_of(item)
    lps = None if d.new_logprobs is None else [_entry_wire(e) for e in d.new_logprobs]
    plp = None if d.prompt_logprobs is None else [None if e is None else _entry_wire(e) for e in d.prompt_logprobs]
    return ["d", d.request_id, d.new_token_ids, d.new_text, d.finished, d.finish_reason, d.error, d.text,
            d.num_prompt_tokens, lps, plp]


def _entry_wire(entry: dict) -> list:
    return [[t, lp.logprob, lp.rank, lp.decoded_token] for t, lp in entry.items()]


def from_wire(w: list):
    """The inverse of `to_wire`; a ValueError names what is malformed (the frame came over a socket)."""
    if not isinstance(w, list) or not w or w[0] not in ("d", "a"):
        raise ValueError(f"output channel: not an output item: {str(w)[:80]!r}")
    try:
        if w[0] == "a":
            _, rid, reason, error = w
            return Aborted(str(rid), str(reason), error)
        _, rid, ids, new_text, fin, reason, error, text, n_prompt, lps, plp = w
        if lps is not None:
            lps = [_entry_of(entry) for entry in lps]
        if plp is not None:
            plp = [None if entry is None else _entry_of(entry) for entry in plp]
        return Delta(str(rid), [int(t) for t in ids], new_text, bool(fin), reason, error, text, int(n_prompt), lps,
                     plp)
    except (TypeError, ValueError) as e:
        raise ValueError(f"output channel: malformed item {str(w)[:80]!r}: {e}") from None


def _entry_of(entry: list) -> dict:
    from ...runtime.sampling import Logprob

    return {int(t): Logprob(float(lp), int(rank), dec) for t, lp, rank, dec in entry}
