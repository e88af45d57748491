"""What every tool-call parser shares: one parse of the text generated so far, used both for a
finished output (the non-streamed answer) and for a growing one (each streamed step).

A format is markup around calls: an optional section (`<｜tool▁calls▁begin｜> ... end`) holding
one or more calls (`<call begin> body <call end>`), or calls standing alone (`<tool_call>`).
`ToolParser.parse(text, final)` splits the text into
- content: the text outside the markup. While the output grows (final False) it is only what
  is certain: a tail that may still become a marker stays back, and so does whitespace between
  or after calls (it is dropped unless more text follows);
- calls: each call whose name is known, with the arguments text known so far (`done` once its
  end marker came).
Growing parses only ever extend the previous one (content and each call's arguments grow at
the end), so a stream is the difference between consecutive parses, and the last parse
(final True) is exactly the non-streamed answer. Markup that cannot be a call (`Malformed`)
and, in a finished output, a call that never ended are returned as content with the rest of
the text after them; when no call was parsed at all the whole text is the content (as vLLM
does). A stream cannot take back a call whose name it already sent: such a call that then
breaks (e.g. cut by max_tokens) stays in the stream although the finished parse drops it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Call", "Parsed", "Malformed", "ToolParser", "held_back"]


class Malformed(ValueError):
    """Markup that cannot be read as a call of this format."""


@dataclass
class Call:
    name: str
    arguments: str  # JSON text (what is known of it so far while not done)
    done: bool = True
    id: str | None = None  # a format-given id (Kimi's functions.NAME:IDX); else the server makes one


@dataclass
class Parsed:
    content: str
    calls: list[Call] = field(default_factory=list)


def held_back(text: str, *markers: str) -> int:
    """Length of the longest tail of `text` that is a proper start of one of `markers` (it may
    still grow into the marker, so it must not be emitted yet)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ToolParser:
    """One format. Subclasses set the markers and read one call's body."""

    name: str = ""
    section: tuple[str, str] | None = None  # (begin, end) around all calls; None: calls stand alone
    call: tuple[str, str] = ("", "")  # (begin, end) of one call
    extra_tokens: tuple[str, ...] = ()  # other markup tokens the text must keep (detokenization)

    def __init__(self, tools: list[dict] | None = None):
        self.tools = tools or []

    @classmethod
    def tokens(cls) -> tuple[str, ...]:
        """Every marker string: they must survive detokenization (special tokens kept)."""
        return tuple(dict.fromkeys((*(cls.section or ()), *cls.call, *cls.extra_tokens)))

    # ---- one call's body (between the call markers) ----
    def read_call(self, body: str, index: int) -> Call:
        """The call of a complete body; raises Malformed."""
        raise NotImplementedError

    def read_partial(self, body: str, index: int) -> Call | None:
        """The call of a body still growing (its end not yet seen, a tail that may become the
        end marker already cut off): None while its name is not known. Default: a call shows
        only once complete."""
        return None

    # ---- the whole text ----
    def parse(self, text: str, final: bool) -> Parsed:
        start = self.section[0] if self.section else self.call[0]
        pieces: list[str] = []
        calls: list[Call] = []
        pos = 0
        while True:
            i = text.find(start, pos)
            piece = text[pos:] if i < 0 else text[pos:i]
            if i < 0 and not final:
                piece = piece[:len(piece) - held_back(piece, start)]
            if pos == 0:
                pieces.append(piece)  # the text before any markup: as written
            elif piece.strip():
                pieces.append(piece)  # text between or after calls: only when it is more than whitespace
            if i < 0:
                break
            try:
                end = self._markup(text, i + len(start), final, calls)
            except Malformed:
                # Not a call: this markup and all after it are text. (Stable as the text grows:
                # the same markup stays malformed, so a stream may send it at once.)
                calls = [c for c in calls if c.done]
                if not calls:
                    return Parsed(text, [])
                pieces.append(text[i:])
                break
            if end is None:  # the markup is still growing
                break
            pos = end
        return Parsed("".join(pieces), calls)

    def _markup(self, text: str, j: int, final: bool, calls: list[Call]) -> int | None:
        """Read the markup from j (after its start marker) into calls: the end position, None
        when it is incomplete (growing text), Malformed when it cannot be markup."""
        cb = self.call[0]
        if self.section is None:
            return self._one_call(text, j, final, calls)
        se = self.section[1]
        while True:
            while j < len(text) and text[j].isspace():
                j += 1
            if text.startswith(cb, j):
                j = self._one_call(text, j + len(cb), final, calls)
                if j is None:
                    return None
            elif text.startswith(se, j):
                return j + len(se)
            else:
                rest = text[j:]
                if final and not rest and calls:
                    return j  # the output ended after its last call, without the section's end marker
                if not final and (cb.startswith(rest) or se.startswith(rest)):
                    return None
                raise Malformed(f"unexpected text in the tool-call section: {rest[:40]!r}")

    def _one_call(self, text: str, j: int, final: bool, calls: list[Call]) -> int | None:
        ce = self.call[1]
        k = text.find(ce, j)
        if k < 0:
            if final:
                raise Malformed("a tool call without its end marker")
            body = text[j:]
            body = body[:len(body) - held_back(body, ce)]
            partial = self.read_partial(body, len(calls))
            if partial is not None:
                partial.done = False
                calls.append(partial)
            return None
        calls.append(self.read_call(text[j:k], len(calls)))
        return k + len(ce)
