"""`mla-export serve`: an OpenAI-compatible HTTP server around one `LLMEngine`.

`create_app(engine, model_name=...)` builds the Starlette app; `mla_export.cli.commands.serve` runs
it on uvicorn. Imports starlette (and uvicorn in the command), never torch.
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'mla_export.server' has no attribute {name!r}")
