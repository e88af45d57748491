"""The reasoning split and tool-call parse as the server did them before its stream was read
incrementally: one parse of the WHOLE text (kept here only as the tests' reference; the
server's non-streamed message is now the incremental reading fed the whole text at once).
`reference_message(...)` is the non-streamed chat message those whole-text parses give."""

from __future__ import annotations

from mla_export.server.tool_parsers import Call, Malformed, Parsed
from mla_export.server.tool_parsers.base import held_back

START, END = "<think>", "</think>"


def split(opens: bool, text: str, final: bool) -> tuple[str | None, str | None]:
    """(thinking, answer): the answer is None until the thinking has ended."""
    if text.startswith(START):
        body = text[len(START):]
    elif not final and START.startswith(text):
        return None, None
    elif opens:
        body = text
    else:
        return None, text
    e = body.find(END)
    if e >= 0:
        return body[:e], body[e + len(END):]
    if not final:
        body = body[:len(body) - held_back(body, END)]
    return body, None


def parse(p, text: str, final: bool) -> Parsed:
    """Parser `p`'s reading of the whole text (its read_call / read_partial)."""
    start = p.section[0] if p.section else p.call[0]
    pieces: list[str] = []
    calls: list[Call] = []
    pos = 0
    while True:
        i = text.find(start, pos)
        piece = text[pos:] if i < 0 else text[pos:i]
        if i < 0 and not final:
            piece = piece[:len(piece) - held_back(piece, start)]
        if pos == 0:
            pieces.append(piece)
        elif piece.strip():
            pieces.append(piece)
        if i < 0:
            break
        try:
            end = _markup(p, text, i + len(start), final, calls)
        except Malformed:
            calls = [c for c in calls if c.done]
            if not calls:
                return Parsed(text, [])
            pieces.append(text[i:])
            break
        if end is None:
            break
        pos = end
    return Parsed("".join(pieces), calls)


def _markup(p, text: str, j: int, final: bool, calls: list[Call]) -> int | None:
    cb = p.call[0]
    if p.section is None:
        return _one_call(p, text, j, final, calls)
    se = p.section[1]
    while True:
        while j < len(text) and text[j].isspace():
            j += 1
        if text.startswith(cb, j):
            j = _one_call(p, text, j + len(cb), final, calls)
            if j is None:
                return None
        elif text.startswith(se, j):
            return j + len(se)
        else:
            rest = text[j:]
            if final and not rest and calls:
                return j
            if not final and (cb.startswith(rest) or se.startswith(rest)):
                return None
            raise Malformed(f"unexpected text in the tool-call section: {rest[:40]!r}")


def _one_call(p, text: str, j: int, final: bool, calls: list[Call]) -> int | None:
    ce = p.call[1]
    k = text.find(ce, j)
    if k < 0:
        if final:
            raise Malformed("a tool call without its end marker")
        body = text[j:]
        body = body[:len(body) - held_back(body, ce)]
        partial = p.read_partial(body, len(calls))
        if partial is not None:
            partial.done = False
            calls.append(partial)
        return None
    calls.append(p.read_call(text[j:k], len(calls)))
    return k + len(ce)


def reference_message(opens: bool | None, parser, text: str, parallel: bool = True) -> dict:
    """The non-streamed message {content, reasoning, tool_calls [(name, arguments, format id)]}
    (`opens` None: no reasoning parser; `parser` None: no tool-call parser)."""
    thinking, answer = split(opens, text, True) if opens is not None else (None, text)
    calls: list[Call] = []
    if answer is not None and parser is not None:
        parsed = parse(parser, answer, True)
        answer, calls = parsed.content, parsed.calls[:None if parallel else 1]
    if opens is not None or calls:
        answer = answer or None
    return {"content": answer, "reasoning": (thinking or None) if opens is not None else None,
            "tool_calls": [(c.name, c.arguments, c.id) for c in calls]}


def reference_deltas(opens: bool | None, parse_fn, text: str, ends: list[int], parallel: bool = True,
                     forced: bool = False) -> list[dict]:
    """The streamed deltas as differences of consecutive whole-text parses, one per end in `ends`
    (the last is len(text)); `parse_fn(text, final) -> Parsed` (None: no tool-call parser).
    Call ids are left out ("id" is True on a call's first delta). `forced`: the stream reads the
    growing text (final False) throughout, as a forced tool_choice's does."""
    sent_r = sent_c = 0
    sent_calls: list[int] = []
    out = []
    for e in ends:
        final = e == len(text) and not forced
        thinking, answer = split(opens, text[:e], final) if opens is not None else (None, text[:e])
        calls: list[Call] = []
        if answer is not None and parse_fn is not None:
            parsed = parse_fn(answer, final)
            answer, calls = parsed.content, parsed.calls[:None if parallel else 1]
        d: dict = {}
        if thinking is not None and len(thinking) > sent_r:
            d["reasoning"] = d["reasoning_content"] = thinking[sent_r:]
            sent_r = len(thinking)
        if answer is not None and len(answer) > sent_c:
            d["content"] = answer[sent_c:]
            sent_c = len(answer)
        tool_deltas = []
        for i, c in enumerate(calls):
            if i == len(sent_calls):
                sent_calls.append(len(c.arguments))
                tool_deltas.append({"index": i, "id": c.id or True, "type": "function",
                                    "function": {"name": c.name, "arguments": c.arguments}})
            elif len(c.arguments) > sent_calls[i]:
                tool_deltas.append({"index": i, "function": {"arguments": c.arguments[sent_calls[i]:]}})
                sent_calls[i] = len(c.arguments)
        if tool_deltas:
            d["tool_calls"] = tool_deltas
        out.append(d)
    return out
