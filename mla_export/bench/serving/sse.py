"""The server-sent-event stream of a streamed /v1/completions response, as both servers send it.

OpenAI / vLLM / `mla-export serve`: one `data: {...}` event per chunk of text (`choices[0].text`,
`finish_reason` on the last), with stream_options.include_usage a last event with `choices: []`
and `usage`, then `data: [DONE]`. llama-server: the same chunks, but its last chunk carries an
empty text with the finish_reason AND the usage (some versions also put a running usage on every
chunk), and a chunk may hold several tokens' text. So: the last `usage` seen wins wherever it
comes, and a chunk of empty text that only closes the choice (finish_reason set) is not a token.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass


class SSEDecoder:
    """Bytes in, the `data` payloads of complete events out (comments and other fields dropped).
    Events end at a blank line (LF or CRLF); a multi-line data field joins with newlines."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += self._utf8.decode(chunk).replace("\r\n", "\n").replace("\r", "\n")
        out = []
        while "\n\n" in self._buf:
            block, self._buf = self._buf.split("\n\n", 1)
            data = self._data_of(block)
            if data is not None:
                out.append(data)
        return out

    def close(self) -> list[str]:
        """A last event the server did not end with a blank line."""
        rest, self._buf = self._buf + self._utf8.decode(b"", final=True), ""
        data = self._data_of(rest)
        return [] if data is None else [data]

    @staticmethod
    def _data_of(block: str) -> str | None:
        lines = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
        return "\n".join(lines) if lines else None


@dataclass
class CompletionEvent:
    """One parsed `data:` payload."""

    done: bool = False  # `[DONE]`
    is_token: bool = False  # carries generated output (text, possibly empty for a special token)
    text: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None  # an error object sent inside the stream


def parse_completion_event(data: str) -> CompletionEvent:
    if data.strip() == "[DONE]":
        return CompletionEvent(done=True)
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as e:
        return CompletionEvent(error=f"a stream event is not JSON ({e}): {data[:200]!r}")
    if not isinstance(obj, dict):
        return CompletionEvent(error=f"a stream event is not a JSON object: {data[:200]!r}")
    if obj.get("error") is not None:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        return CompletionEvent(error=f"the server sent an error in the stream: {msg}")
    ev = CompletionEvent()
    usage = obj.get("usage")
    if isinstance(usage, dict):
        ev.usage = usage
    choices = obj.get("choices")
    if isinstance(choices, list) and choices:
        c = choices[0] if isinstance(choices[0], dict) else {}
        text = c.get("text")
        ev.text = text if isinstance(text, str) else ""
        ev.finish_reason = c.get("finish_reason")
        # vLLM counts every chunk with choices; a closing chunk with no text (llama-server's last
        # one) would add a spurious inter-token gap and move the end of the request.
        ev.is_token = bool(ev.text) or ev.finish_reason is None
    return ev
