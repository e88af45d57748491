"""The text of a chat choice whose parser markers are special tokens (Kimi's), as the server
decodes it itself (server/marker_text.py): grown from each step's new ids, stop strings matched
on the held tail and the new piece, the whole output decoded once at the end.

- equivalence: Kimi-style outputs (thinking, content, several calls, multibyte characters that
  the byte-level tokenizer splits across tokens), sent a few tokens per engine delta, with stop
  strings that fall anywhere (across deltas, inside markup): the streamed text adds up to the
  final text, which is the whole output's marker-keeping decode cut at the first stop string,
  and the streamed chat deltas add up to the non-streamed message, which is the whole-text
  parse of that text (tests/whole_text_parsers.py);
- cost: before the finishing delta no step decodes more than a few ids nor matches stop strings
  on more than the held tail and the new piece (each step decoded all the ids and searched the
  whole text).
No model: the tokenizer is the tiny preset's byte-level BPE with the markers added as special
tokens, as Kimi's tokenizer has them.
"""

from __future__ import annotations

import json

import pytest

import whole_text_parsers as ref
from mla_export.checkpoint.presets import train_tokenizer
from mla_export.runtime.stop_strings import match_stop_strings
from mla_export.server.chat_output import ChoiceOutput
from mla_export.server.chat_tools import marker_decoder
from mla_export.server.reasoning_parsers import ThinkSplitter
from mla_export.server.tool_parsers import TOOL_PARSERS
from test_tool_parsers import TOOLS, kimi

KIMI = TOOL_PARSERS["kimi_k2"]
SPECIAL = [*KIMI.tokens(), "<think>", "</think>", "<|im_end|>"]
WORDS = ["Paris", "Zürich 🏔", "東京 🗼", "emoji 😀 ok", "naïve café", "x < y", "the weather"]


@pytest.fixture(scope="module")
def tok():
    t = train_tokenizer(320)
    t.add_special_tokens(SPECIAL)
    return t


def kimi_output(rng) -> str:
    out = "<think>" + " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(1, 8)))) + "</think>"
    out += " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(0, 5))))
    n = int(rng.integers(0, 4))
    if n:
        out += "<|tool_calls_section_begin|>" + "".join(
            kimi(str(rng.choice(["get_weather", "get_time"])), i,
                 json.dumps({"city": str(rng.choice(WORDS))}, ensure_ascii=False)) for i in range(n))
        out += "<|tool_calls_section_end|>"
    return out + "<|im_end|>"


def serve(tok, ids: list[int], group_sizes, stop: list[str], include_stop: bool, stream: bool):
    """The server's response path over these ids (several per engine delta, as next_events may
    join them): (the text pieces emitted, the final text, the chat deltas or the message)."""
    from mla_export.server import protocol as P
    from mla_export.server.deltas import Delta
    from mla_export.server.generation import _Choice, chat_choice, chat_delta, make_detok

    s = P.parse_chat_request({"messages": [{"role": "user", "content": "x"}], "stream": stream}).sampling
    detok = make_detok(lambda t: tok.decode(t, skip_special_tokens=True),
                       marker_decoder(tok, ThinkSplitter.tokens + KIMI.tokens()))
    ch = _Choice(index=0, request_id="r", stop=stop, include_stop=include_stop)
    ch.out = ChoiceOutput(reasoning=ThinkSplitter(opens=False), tools=KIMI(TOOLS))
    pieces, deltas, sent, k = [], [], "", 0
    for size in group_sizes:
        new = ids[k:k + size]
        k += len(new)
        done = k == len(ids)
        text = tok.decode(ids[:k], skip_special_tokens=True)  # the engine's own text (markers skipped)
        text = text if done else text.rstrip("\ufffd")
        d = Delta("r", new, text[len(sent):], done, "stop" if done else None, text=text if done else None)
        sent = text
        ch.token_ids += new
        piece = detok.advance(ch, d)
        ch.add_text(piece)
        pieces.append(piece)
        if done:
            ch.finished, ch.finish_reason = True, "stop"
        if stream and (c := chat_delta(ch, piece, new, None, s)) is not None:
            deltas.append(c["delta"])
        if done:
            break
    return pieces, ch.final_text, deltas if stream else chat_choice(ch, False)["message"]


def groups(rng, n: int) -> list[int]:
    out = []
    while sum(out) < n:
        out.append(int(rng.integers(1, 5)))
    return out


class TestTheStreamedTextIsTheWholeDecode:
    """Cause: the marker-keeping text is grown from new ids only; it must still be the decode of
    all ids (multibyte characters split across tokens, markers kept, other specials dropped)
    and stop where a stop string completes, whatever deltas it came in."""

    def test_random_outputs_and_stop_strings(self, tok, rng):
        decode = marker_decoder(tok, ThinkSplitter.tokens + KIMI.tokens())
        split_chars = 0
        for _ in range(40):
            text = kimi_output(rng)
            ids = tok.encode(text, add_special_tokens=False).ids
            split_chars += sum("\ufffd" in tok.decode([i]) for i in ids)
            whole = decode(ids)
            assert whole == text[:-len("<|im_end|>")]  # markers kept, <|im_end|> (special) dropped
            stop = []
            if rng.random() < 0.7:  # a stop string somewhere in the text (maybe inside markup)
                a = int(rng.integers(0, len(whole)))
                stop = [whole[a:a + int(rng.integers(1, 9))], "never in the text"]
            include = bool(rng.random() < 0.5)
            want = match_stop_strings("", whole, stop, include, final=True)[0] if stop else whole
            pieces, final, _ = serve(tok, ids, groups(rng, len(ids)), stop, include, stream=False)
            assert final == want and "".join(pieces) == want, (text, stop)
            _, _, deltas = serve(tok, ids, groups(rng, len(ids)), stop, include, stream=True)
            _, _, msg = serve(tok, ids, groups(rng, len(ids)), stop, include, stream=False)
            expected = ref.reference_message(False, KIMI(TOOLS), want)
            assert (msg["content"], msg["reasoning"]) == (expected["content"], expected["reasoning"])
            got_calls = [(c["function"]["name"], c["function"]["arguments"], c["id"])
                         for c in msg.get("tool_calls", [])]
            assert got_calls == expected["tool_calls"]
            content = "".join(d.get("content", "") for d in deltas) or None
            reasoning = "".join(d.get("reasoning", "") for d in deltas) or None
            calls: list[list] = []
            for d in deltas:
                for tc in d.get("tool_calls", []):
                    if "id" in tc:
                        calls.append([tc["function"]["name"], tc["function"]["arguments"], tc["id"]])
                    else:
                        calls[tc["index"]][1] += tc["function"]["arguments"]
            assert (content, reasoning) == (expected["content"], expected["reasoning"]), (text, stop)
            assert [tuple(c) for c in calls][:len(got_calls)] == got_calls
        assert split_chars > 20, "the outputs have characters split across tokens"


class TestAMarkerStepDoesNotGrowWithTheOutput:
    """Cause: every step decoded all of the choice's ids and searched the whole text for stop
    strings, so a reply of n tokens cost O(n^2)."""

    def test_decode_and_stop_matching_per_step(self, tok, monkeypatch):
        import mla_export.runtime.stop_strings as ss

        decoded: list[int] = []
        real_decode = tok.decode
        def counting_decode(ids, skip_special_tokens=True):
            decoded.append(len(ids))
            return real_decode(ids, skip_special_tokens=skip_special_tokens)

        # The server's decodes of id lists go through it (DecodeStream decodes its few-id window
        # inside the tokenizers library: not counted, bounded by its design).
        tok.decode = counting_decode
        searched: list[int] = []
        real_match = ss.match_stop_strings
        monkeypatch.setattr(ss, "match_stop_strings", lambda held, new, *a, **k: (
            searched.append(len(held) + len(new)), real_match(held, new, *a, **k))[1])
        try:
            text = " ".join(WORDS * 60) + "<|tool_calls_section_begin|>" + kimi("get_weather", 0, '{"city": "東京"}')
            ids = tok.encode(text, add_special_tokens=False).ids
            assert len(ids) > 1000
            per_step_decode, per_step_search = [], []
            from mla_export.server.deltas import Delta
            from mla_export.server.generation import _Choice, make_detok

            detok = make_detok(lambda t: real_decode(t, skip_special_tokens=True),
                               marker_decoder(tok, ThinkSplitter.tokens + KIMI.tokens()))
            ch = _Choice(index=0, request_id="r", stop=["never in this text"])
            for k, i in enumerate(ids):
                done = k == len(ids) - 1
                decoded.clear()
                searched.clear()
                ch.token_ids.append(i)
                ch.add_text(detok.advance(ch, Delta("r", [i], "", done, "stop" if done else None,
                                                    text="" if done else None)))
                if not done:
                    per_step_decode.append(sum(decoded))
                    per_step_search.append(max(searched, default=0))
            assert max(per_step_decode) <= 8, max(per_step_decode)  # never all the ids
            assert max(per_step_search) <= 64, max(per_step_search)  # the held tail + the new piece
            assert decoded == [len(ids)]  # the finishing step: one decode of the whole output
            assert ch.final_text == text
        finally:
            del tok.decode
