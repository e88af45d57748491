"""Reading one JSON document from a file with errors that name the file and say what is wrong
(the checkpoint's config.json, the export's mla_graph.json).

Both files are untrusted input, so what the json module itself raises on hostile text is one
error here too: nesting deeper than the parser's recursion (RecursionError), an integer of more
than 4300 digits (a plain ValueError), bytes that are not UTF-8, and a file far larger than any
real one (read before parsing: a 10 GiB "config" would be read into memory whole).
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_BYTES = 64 << 20  # the largest real ones are tens of KiB (a 1024-layer contract: ~0.4 MiB)


def read_json(path: Path, error: type[Exception], missing: str, max_bytes: int = MAX_BYTES):
    """The parsed document at `path`; `error(...)` when it is absent (`missing` says what the file
    is), larger than `max_bytes`, or not JSON."""
    if not path.is_file():
        raise error(f"{path}: not found{missing}")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path}: {size} bytes, more than the {max_bytes >> 20} MiB such a file can be")
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        if isinstance(e, error):
            raise
        raise error(f"{path}: not readable as JSON: {e}") from None
    except RecursionError:
        raise error(f"{path}: not readable as JSON: nested deeper than the parser allows") from None


def show(value) -> str:
    """A short, safe rendering of an untrusted value for an error message (no deep recursion, no
    megabyte strings)."""
    if isinstance(value, dict):
        return f"an object of {len(value)} key(s)"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, str):
        return repr(value[:60]) + ("..." if len(value) > 60 else "")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)
