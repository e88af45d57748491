"""The incremental stop-string matcher (runtime/stop_strings.py) against a naive one that sees the
whole text at once, on random texts over a small alphabet (so stop strings occur, overlap and
share prefixes), cut into random pieces. Pure string logic: no model, no precision involved."""

from __future__ import annotations

import random

import pytest

from mla_export.runtime.stop_strings import match_stop_strings


def naive_cut(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """The whole text searched at once: the stop string that is complete first (earliest end,
    then the longer one), and the output cut there."""
    hits = [(i + len(s), i, s) for s in stop if (i := text.find(s)) >= 0]
    if not hits:
        return text, None
    end, start, s = min(hits, key=lambda h: h[:2])
    return text[:end if include else start], s


def naive_hold(text: str, stop: list[str]) -> int:
    """The longest tail of `text` that is a proper prefix of a stop string."""
    return max([k for s in stop for k in range(1, len(s)) if k <= len(text) and text.endswith(s[:k])], default=0)


def feed(pieces: list[str], stop: list[str], include: bool, check_steps: bool = True):
    held, emitted, hit = "", "", None
    seen = ""
    for i, piece in enumerate(pieces):
        seen += piece
        final = i == len(pieces) - 1
        emit, held, hit = match_stop_strings(held, piece, stop, include, final)
        emitted += emit
        if check_steps and hit is None:
            # Nothing is lost or invented, and exactly what may still become a stop string is held.
            assert emitted + held == seen
            assert len(held) == (0 if final else naive_hold(seen, stop))
        if hit is not None:
            assert held == ""
            break
    return emitted, hit


@pytest.mark.parametrize("seed", range(300))
def test_incremental_equals_naive_on_random_text(seed):
    rng = random.Random(seed)
    alphabet = "abc" if seed % 3 else "abcdé\n"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
    stop = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
    include = bool(seed % 2)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, max(0, len(text) - 1)))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] or [""]
    if seed % 5 == 0:  # empty pieces: a token that adds no text (inside a UTF-8 character)
        pieces = [p for piece in pieces for p in (piece, "")]
    assert feed(pieces, stop, include) == naive_cut(text, stop, include), (text, stop, pieces)


def test_earliest_complete_stop_wins_whatever_the_pieces():
    # "y" is complete before "xyz" is: token by token generation stops at "y" either way.
    for pieces in (["x", "y", "z"], ["xyz"], ["xy", "z"]):
        assert feed(pieces, ["xyz", "y"], include=True) == ("xy", "y")
    # Two stop strings ending at the same character: the longer one.
    assert feed(["abc"], ["bc", "abc"], include=False) == ("", "abc")


def test_held_text_is_released_when_it_cannot_be_a_stop_or_the_output_ends():
    assert match_stop_strings("", "hello EN", ["END"], False, False) == ("hello ", "EN", None)
    assert match_stop_strings("EN", "X", ["END"], False, False) == ("ENX", "", None)
    assert match_stop_strings("EN", "", ["END"], False, True) == ("EN", "", None)  # final: nothing held
    assert match_stop_strings("EN", "D!", ["END"], True, False) == ("END", "", "END")
