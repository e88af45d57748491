"""Stop strings matched incrementally, as a request's text grows one decoded piece at a time.

The output ends where the first stop string is complete: the one that ends earliest in the
text (of two ending at the same character, the longer one), which is where token-by-token
generation would have stopped, whatever the pieces the text arrived in. Text that could still
grow into a stop string is held back (text once emitted is never taken back), so a step only
searches the held tail (shorter than the longest stop string) plus the new piece: its cost does
not grow with the output.
"""

from __future__ import annotations

__all__ = ["match_stop_strings"]


def match_stop_strings(held: str, new_text: str, stop, include_stop: bool,
                       final: bool) -> tuple[str, str, str | None]:
    """(text to emit now, text still held, the stop string that ends the output or None).

    `held`: what the previous call held; `final`: the output ends after this piece anyway
    (nothing is held back). After a hit nothing is held and the output is over."""
    buf = held + new_text
    best = None  # (end, start, stop string)
    for s in stop:
        i = buf.find(s)
        if i >= 0:
            cand = (i + len(s), i, s)
            if best is None or cand[:2] < best[:2]:  # earliest end, then earliest start (longer)
                best = cand
    if best is not None:
        end, start, s = best
        return buf[:end if include_stop else start], "", s
    if final:
        return buf, "", None
    return _split_hold(buf, stop) + (None,)


def _split_hold(buf: str, stop) -> tuple[str, str]:
    """(emit, hold): hold is the longest tail of `buf` that is a proper prefix of a stop string."""
    hold = 0
    n = len(buf)
    for s in stop:
        k_max = min(len(s) - 1, n)
        if k_max <= hold:
            continue
        # Candidate starts are where the stop string's first character occurs in the tail;
        # the leftmost one that matches is the longest hold for this string.
        first = s[0]
        j = buf.find(first, n - k_max)
        while 0 <= j < n - hold:
            if s.startswith(buf[j:]):
                hold = n - j
                break
            j = buf.find(first, j + 1)
    return buf[:n - hold], buf[n - hold:]
