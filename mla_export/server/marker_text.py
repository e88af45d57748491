"""The text of a chat choice whose parsers need marker tokens that the tokenizer calls special
(Kimi's tool tokens, some Qwen tokenizers' `<think>`): the engine's text skips every special
token, so the server decodes these choices itself, keeping the markers and still skipping the
other special tokens (end of sentence, ...).

`MarkerDecoder(tokenizer, drop)` is that decode of a whole list of ids; `.text()` makes one
choice's `MarkerText`, which grows the text as tokens come, as the engine's own
runtime/detokenizer.py does: the dropped special tokens are filtered out of each step's new ids
and the rest goes through `tokenizers.decoders.DecodeStream(skip_special_tokens=False)`, which
decodes only a short window of ids before the new ones (and holds text back while it ends
inside a UTF-8 character); stop strings are matched incrementally on that text
(runtime/stop_strings.py: the held tail plus the new piece). So a step's work does not grow
with the output. When the choice finishes its whole text is decoded once and cut at the first
stop string: that is the final text (the non-streamed answer), and what it adds to the text
sent is the last piece.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from ..runtime import stop_strings

__all__ = ["MarkerDecoder", "MarkerText"]


class MarkerDecoder:
    def __init__(self, tokenizer, drop: frozenset[int]):
        self.tokenizer = tokenizer
        self.drop = drop  # the special tokens that are not markers

    def __call__(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self.drop], skip_special_tokens=False)

    def text(self, stop: list[str], include_stop: bool) -> "MarkerText":
        return MarkerText(self, stop, include_stop)


class MarkerText:
    """One choice's text, grown from its new token ids."""

    def __init__(self, decoder: MarkerDecoder, stop: list[str], include_stop: bool):
        self.decoder = decoder
        self.stop = stop
        self.include_stop = include_stop
        self._stream = DecodeStream(skip_special_tokens=False)
        self._held = ""  # a tail that may still grow into a stop string
        self.stopped = False  # a stop string is complete: the text is over

    def step(self, new_ids: list[int]) -> str:
        """The text these new tokens add ("" while it ends inside a character, or may grow
        into a stop string, or after a stop string)."""
        if self.stopped:
            return ""
        pieces = []
        for i in new_ids:
            if i not in self.decoder.drop:
                piece = self._stream.step(self.decoder.tokenizer, int(i))
                if piece:
                    pieces.append(piece)
        piece = "".join(pieces)
        if not self.stop:
            return piece
        emit, self._held, hit = stop_strings.match_stop_strings(self._held, piece, self.stop, self.include_stop,
                                                                final=False)
        self.stopped = hit is not None
        return emit

    def finish(self, output_ids: list[int]) -> str:
        """The final text: the whole output decoded once, cut at the first stop string."""
        full = self.decoder(output_ids)
        if self.stop:
            full = stop_strings.match_stop_strings("", full, self.stop, self.include_stop, final=True)[0]
        return full
