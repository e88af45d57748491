"""The seam between the HTTP request handling and whatever runs the engine.

The request handling (app.py, generation.py) needs two things, both typed here:

- `ModelView`: what the handlers know about the model without running it (tokenizer, context
  length, the export's contract with its chat template and token facts).
- `EngineClient`: where sequences go and their outputs come from. `EngineLoop` (the engine in a
  thread of this process, `mla-export serve`) is one; `RayEngineClient` (N engine replicas behind
  a Ray Serve deployment handle, `mla-export serve --replicas N`) is the other.

Outputs arrive on an `OutputQueue` (an asyncio.Queue) per submission, the same items from both
clients: `Delta`s (deltas.py: what one engine step added to a sequence) and `Aborted` for a
sequence the serving side ended.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["EngineClient", "ModelView", "OutputQueue"]


class OutputQueue(asyncio.Queue):
    """The outputs of one submission; `served_by` names the replica that runs it (None when the
    engine is in this process). The HTTP layer sends it as the `x-mla-replica` header."""

    served_by: str | None = None


@runtime_checkable
class EngineClient(Protocol):
    capacity: int  # sequences admitted at once (running + queued) before QueueFull

    def start(self) -> None: ...

    def stop(self, timeout: float | None = None) -> dict:
        """Refuse new work, end what is left; the final stats (kv_blocks_used should be 0)."""

    @property
    def alive(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    async def submit(self, seqs: list) -> asyncio.Queue:
        """Admit the sequences (all or none) or raise QueueFull / ShuttingDown / EngineDead /
        ValueError (the engine's own refusal)."""

    def abort(self, request_ids: list[str], reason: str = "abort") -> None: ...

    def stats(self) -> dict:
        """The engine's stats (summed over replicas when there are several)."""

    def replica_stats(self) -> dict[str, dict]:
        """Per-replica stats by replica id ({} for an in-process engine)."""


@dataclass
class ModelView:
    tokenizer: Any  # tokenizers.Tokenizer or None
    tokenizer_path: Path | None
    max_model_len: int | None
    contract: dict = field(default_factory=dict)  # mla_graph.json as a dict
    out_dir: Path | None = None  # where the export's chat template file may be

    @property
    def facts(self) -> dict:
        return self.contract.get("model", {})

    @classmethod
    def of_engine(cls, engine) -> "ModelView":
        """From an `LLMEngine` (or an object with its attributes: tests use small fakes)."""
        c = getattr(engine, "contract", None)
        raw = c if isinstance(c, dict) else getattr(c, "raw", None)
        tok_path = getattr(getattr(engine, "facts", None), "tokenizer_path", None)
        out_dir = getattr(c, "out_dir", None)
        return cls(tokenizer=getattr(engine, "tokenizer", None), tokenizer_path=Path(tok_path) if tok_path else None,
                   max_model_len=getattr(engine, "max_model_len", None),
                   contract=raw if isinstance(raw, dict) else {}, out_dir=Path(out_dir) if out_dir else None)

    @classmethod
    def of_export(cls, out_dir: str | Path, max_model_len: int, verify: str | None = None) -> "ModelView":
        """From an export directory without loading the graph (the Ray ingress: the replicas run
        the model and report the context length their caches hold)."""
        from mla_export.runtime.model_dir import load_model_dir

        contract, facts = load_model_dir(out_dir, verify)
        return cls(tokenizer=facts.load_tokenizer(), tokenizer_path=facts.tokenizer_path,
                   max_model_len=int(max_model_len), contract=contract.raw, out_dir=Path(out_dir))
