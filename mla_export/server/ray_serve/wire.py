"""What the ingress sends an engine replica and what comes back (pickled by Ray).

A call is one HTTP generation request: its sequences (n choices of one or more prompts) go to
one replica together, so the choices share the prompt's prefix-cached blocks. The replica's
stream is a series of messages:

    ("accepted", replica_id, None)              first, once the sequences are in its engine
    ("rejected", kind, message)                 or instead: kind in REJECT_KINDS
    ("out", [RequestOutput | Aborted, ...])     the engine's outputs of one or more steps
    ("stats", snapshot)                         last: the replica's stats after the call ended
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineCall", "REJECT_KINDS"]

REJECT_KINDS = ("queue_full", "shutting_down", "engine_dead", "invalid")


@dataclass
class EngineCall:
    seqs: list  # SeqRequest

    @property
    def prompt_ids(self) -> list[int]:
        """The first sequence's prompt token ids: what the router matches on."""
        p = self.seqs[0].prompt if self.seqs else []
        return list(p) if isinstance(p, (list, tuple)) else []
