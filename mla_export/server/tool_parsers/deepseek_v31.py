"""DeepSeek-V3.1 (vLLM `deepseek_v31`): the name, then the arguments as plain JSON:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

from .base import Call, Malformed, ToolParser

SEP = "<｜tool▁sep｜>"


class DeepSeekV31ToolParser(ToolParser):
    name = "deepseek_v31"
    section = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    extra_tokens = (SEP,)

    def read_call(self, body: str, index: int) -> Call:
        name, sep, args = body.partition(SEP)
        if not sep or not name.strip() or "\n" in name.strip():
            raise Malformed(f"not a DeepSeek-V3.1 tool call: {body[:60]!r}")
        return Call(name.strip(), args.strip())

    def read_partial(self, body: str, index: int) -> Call | None:
        name, sep, args = body.partition(SEP)
        if not sep or not name.strip() or "\n" in name.strip():
            return None
        return Call(name.strip(), args.lstrip().rstrip())
