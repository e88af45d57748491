"""What the CLI prints for people: model text made safe for a terminal, and the line that says an
export's weights are random.

A model's text can hold any code point its tokenizer decodes to: a random-weight model (the
tiny preset, tools/make_checkpoint.py) emits control bytes (ESC, BEL, CR, ...) as readily as
letters, and raw ones would move the cursor, ring the bell or rewrite the terminal's state.
`terminal_safe` writes them as Python-style escapes instead; newline and tab stay as they are.
Only the CLI's printed text goes through it: the server's JSON and the offline API's
outputs keep the model's text exactly (JSON escapes control characters itself)."""

from __future__ import annotations

import unicodedata

__all__ = ["terminal_safe"]

KEEP = frozenset("\n\t")
# Format characters that reorder or hide what a terminal shows ("Trojan Source": bidi embeddings,
# overrides and isolates); the other Cf characters (joiners in emoji, soft hyphen) stay.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: str) -> str:
    """`text` with control characters (C0, DEL, C1), lone surrogates and bidi controls escaped."""
    if text.isprintable():  # the common case: no character to look at (newline and tab are not printable)
        return text
    return "".join(ch if ch in KEEP or not _unsafe(ch) else _escape(ch) for ch in text)


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cs") or ch in BIDI_CONTROLS
