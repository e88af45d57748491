"""Reading one JSON document from a file with errors that name the file and say what is wrong
(the checkpoint's config.json, the export's mla_graph.json)."""

from __future__ import annotations

import json
from pathlib import Path


def read_json(path: Path, error: type[Exception], missing: str):
    """The parsed document at `path`; `error(...)` when it is absent (`missing` says what the file
    is) or not JSON."""
    if not path.is_file():
        raise error(f"{path}: not found{missing}")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise error(f"{path}: not readable as JSON: {e}") from e
