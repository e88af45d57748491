"""DeepSeek-V3 / R1 (vLLM `deepseek_v3`): one section of calls, each `function` (the call type),
the name and the arguments in a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

import re

from .base import Call, Malformed, ToolParser, held_back

SEP = "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json\n", "\n```"
_CALL = re.compile(r"(?P<type>[^\n]*?)" + re.escape(SEP) + r"(?P<name>[^\n]*)\n```json\n(?P<args>.*)\n```\s*", re.DOTALL)


class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"
    section = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    call = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
    extra_tokens = (SEP,)

    def read_call(self, body: str, index: int) -> Call:
        m = _CALL.fullmatch(body)
        if m is None or not m["name"].strip():
            raise Malformed(f"not a DeepSeek-V3 tool call: {body[:60]!r}")
        return Call(m["name"].strip(), m["args"].strip())

    def read_partial(self, body: str, index: int) -> Call | None:
        s = body.find(SEP)
        if s < 0:
            return None
        nl = body.find("\n", s)
        if nl < 0 or not body[s + len(SEP):nl].strip():
            return None
        rest = body[nl + 1:]
        if not rest.startswith(FENCE_OPEN):
            return None  # the fence is still to come (or the call is malformed: the finished parse says)
        args = rest[len(FENCE_OPEN):]
        # The call's end marker may have started: "\n```" then <｜tool▁call▁end｜>.
        args = args[:len(args) - held_back(args, FENCE_CLOSE + self.call[1])]
        return Call(body[s + len(SEP):nl].strip(), args.lstrip().rstrip())
