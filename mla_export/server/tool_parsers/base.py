"""What every tool-call parser shares: one reading of the output as it grows (`ToolStream`),
fed the new text of each streamed step, and the same reading fed the whole text at once for a
finished output (the non-streamed answer, `ToolParser.parse`).

A format is markup around calls: an optional section (`<｜tool▁calls▁begin｜> ... end`) holding
one or more calls (`<call begin> body <call end>`), or calls standing alone (`<tool_call>`).
`ToolStream.feed(piece, final)` returns
- content: the new text outside the markup. While the output grows (final False) it is only
  what is certain: a tail that may still become a marker stays back, and so does whitespace
  between or after calls (it is dropped unless more text follows);
- call deltas: a call shows once its name is known (index, name, id and the arguments known
  then), later deltas carry argument fragments; a call is complete once its end marker came.
A step's work does not grow with the output: the stream keeps only what is not settled yet
(a held tail, the call still open), and searches the held tail plus the new piece. Only the
open call's body is read again each step (a format reads a call's body whole: `read_call`,
`read_partial`). Markup that cannot be a call (`Malformed`) and, in a finished output, a call
that never ended are returned as content, from that markup's start marker to the end of the
text; calls read before it are kept (with none, the content is the whole text, as vLLM does).
A stream cannot take back a call whose name it already sent: such a call that then breaks
(e.g. cut by max_tokens) stays in the stream although the finished reading drops it. Everything else is the same however the text is cut into pieces, so the
deltas of a stream add up to the non-streamed answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Call", "CallDelta", "Parsed", "Malformed", "ToolParser", "ToolStream", "CallTracker", "held_back",
           "calls_of"]


class Malformed(ValueError):
    """Markup that cannot be read as a call of this format."""


@dataclass
class Call:
    name: str
    arguments: str  # JSON text (what is known of it so far while not done)
    done: bool = True
    id: str | None = None  # a format-given id (Kimi's functions.NAME:IDX); else the server makes one


@dataclass
class CallDelta:
    """What one step adds to call `index`: its first delta has its name (and a format-given id),
    every delta the arguments text it adds."""

    index: int
    arguments: str
    name: str | None = None
    id: str | None = None


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


class CallTracker:
    """Successive readings of the calls, turned into deltas. Calls are read in order and a call
    is only read after the one before it is complete, so only the last one can still grow."""

    def __init__(self):
        self.count = 0  # calls announced
        self._sent = 0  # arguments length sent of the last one

    def update(self, index: int, call: Call, out: list[CallDelta]) -> None:
        if index == self.count:
            self.count += 1
            self._sent = len(call.arguments)
            out.append(CallDelta(index, call.arguments, call.name, call.id))
        elif index == self.count - 1 and len(call.arguments) > self._sent:
            out.append(CallDelta(index, call.arguments[self._sent:]))
            self._sent = len(call.arguments)


def calls_of(deltas: list[CallDelta]) -> list[Call]:
    """The calls that these deltas add up to (a finished output's, read at once)."""
    calls: list[Call] = []
    for d in deltas:
        if d.index == len(calls):
            calls.append(Call(d.name or "", d.arguments, id=d.id))
        else:
            calls[d.index].arguments += d.arguments
    return calls


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

    # ---- an output ----
    def stream(self) -> "ToolStream":
        """A reading of one output, fed as it grows."""
        return ToolStream(self)

    def parse(self, text: str, final: bool) -> Parsed:
        """The reading of this whole text (a stream fed it at once)."""
        s = self.stream()
        content, deltas = s.feed(text, final)
        calls = calls_of(deltas)
        for c in calls[:-1]:
            c.done = True
        if calls:
            calls[-1].done = s.last_done
        return Parsed(content, calls)


# the stream's states
_OUT, _SECTION, _CALL, _TEXT = "out", "section", "call", "text"


class ToolStream:
    """One output read as it grows (the module docstring says what it returns). Between
    markups it holds back at most a tail that may become the start marker (plus whitespace
    after a call, until text that is more than whitespace follows); in a section, a tail that
    may become a marker (whitespace there is skipped); in a call, the call's body so far."""

    def __init__(self, parser: ToolParser):
        self.p = parser
        self.tracker = CallTracker()
        self.last_done = True  # the last call read is complete
        self._start = parser.section[0] if parser.section else parser.call[0]
        self._state = _OUT
        self._solid = True  # before any markup, or text after one that is more than whitespace: sent as written
        self._ws: list[str] = []  # whitespace held after a markup (dropped if a markup or the end follows)
        self._tail = ""  # _OUT: a tail that may become the start marker; _SECTION: text after whitespace
        self._body = ""  # _CALL: the open call's body so far
        self._raw: list[str] = []  # the open markup's text from its start marker (content if it is malformed)

    def feed(self, piece: str, final: bool) -> tuple[str, list[CallDelta]]:
        """(content it adds, call deltas) for the next piece of the output; `final`: the output
        ends with it."""
        content: list[str] = []
        deltas: list[CallDelta] = []
        if self._state == _TEXT:
            return piece, deltas
        if self._state != _OUT:
            self._raw.append(piece)
        try:
            self._run(piece, final, content, deltas)
        except Malformed:
            # Not a call: this markup and all after it are text. (Stable as the text grows:
            # the same markup stays malformed, so a stream may send it at once.)
            self._state = _TEXT
            self.last_done = True
            content.append("".join(self._raw))
            self._raw = []
        return "".join(content), deltas

    def _run(self, text: str, final: bool, content: list[str], deltas: list[CallDelta]) -> None:
        while True:
            if self._state == _OUT:
                text = self._out(text, final, content)
            elif self._state == _SECTION:
                text = self._section(text, final)
            else:
                text = self._call(text, final, deltas)
            if text is None:
                return

    def _out(self, piece: str, final: bool, content: list[str]) -> str | None:
        """Text between markups: the rest after a start marker, or None once all is read."""
        text = self._tail + piece
        i = text.find(self._start)
        before = text if i < 0 else text[:i]
        keep = held_back(before, self._start) if i < 0 and not final else 0
        before = before[:len(before) - keep]
        self._tail = text[len(text) - keep:] if keep else ""
        if not self._solid and before.strip():  # more than whitespace: all of it is text
            self._solid = True
            before = "".join(self._ws) + before
            self._ws = []
        if self._solid:
            content.append(before)
        elif before:
            self._ws.append(before)
        if i < 0:
            return None
        self._ws = []
        rest = text[i + len(self._start):]
        self._raw = [text[i:]]
        self._state = _SECTION if self.p.section else _CALL
        return rest

    def _end_markup(self) -> None:
        self._state, self._solid, self._raw = _OUT, False, []

    def _section(self, piece: str, final: bool) -> str | None:
        """Between the calls of a section: the rest after a call's start marker or after the
        section's end, None when the text ends here."""
        cb, se = self.p.call[0], self.p.section[1]
        text = (self._tail + piece).lstrip()
        self._tail = ""
        if text.startswith(cb):
            self._state, self._body = _CALL, ""
            return text[len(cb):]
        if text.startswith(se):
            self._end_markup()
            return text[len(se):]
        if final and not text and self.tracker.count:
            self._end_markup()  # the output ended after its last call, without the section's end marker
            return None
        if not final and (cb.startswith(text) or se.startswith(text)):
            self._tail = text
            return None
        raise Malformed(f"unexpected text in the tool-call section: {text[:40]!r}")

    def _call(self, piece: str, final: bool, deltas: list[CallDelta]) -> str | None:
        """In a call's body: the rest after its end marker, None while it is open."""
        ce = self.p.call[1]
        seen = len(self._body)
        body = self._body + piece
        k = body.find(ce, max(0, seen - len(ce) + 1))  # the body before had no end marker
        index = self.tracker.count - (0 if self.last_done else 1)
        if k < 0:
            if final:
                raise Malformed("a tool call without its end marker")
            self._body = body
            partial = self.p.read_partial(body[:len(body) - held_back(body, ce)], index)
            if partial is not None:
                self.tracker.update(index, partial, deltas)
                self.last_done = False
            return None
        self.tracker.update(index, self.p.read_call(body[:k], index), deltas)
        self.last_done = True
        self._body = ""
        rest = body[k + len(ce):]
        if self.p.section:
            self._state = _SECTION
        else:
            self._end_markup()
        return rest
