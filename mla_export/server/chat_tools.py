"""What a chat request's tools and the server's parsers make of one request (vLLM's rules):

- tool_choice "none": the tools are rendered into the prompt, the output is plain text;
- "auto": needs the server started with --enable-auto-tool-choice and --tool-call-parser,
  else 400 (vLLM's message); tool calls are parsed out of the output;
- "required" or a named function: forced as vLLM does, with a JSON-schema constraint
  (structured outputs) built from the tools (forced_tools.py), whatever the server's flags; the
  output is read back as tool calls. The constraint holds from the first generated token, so
  there is no thinking to split out then (--reasoning-parser does not apply).
- --reasoning-parser: the thinking is split out of every other chat output (reasoning_parsers.py).

`plan(st, req)` checks the request against the server; `plan.template_args()` are the chat
template's arguments besides the messages; `plan.output(prompt_text)` is the per-choice
ChoiceOutput factory (None: plain text) and `plan.decode` the decoder of the text when the
parsers' markup tokens are special tokens (kept: marker_text.py), else None.
"""

from __future__ import annotations

from typing import Callable

from . import protocol as P
from .chat_output import ChoiceOutput
from .forced_tools import NamedCall, RequiredCalls
from .marker_text import MarkerDecoder
from .reasoning_parsers import ThinkSplitter, reasoning_splitter

__all__ = ["ChatPlan", "plan"]

AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class ChatPlan:
    def __init__(self, st, req: P.ChatRequest):
        self.st, self.req = st, req
        tool = req.tool
        self.tool_cls = None
        self.forced = tool is not None and tool.forced
        if self.forced:  # the request's sampling takes the constraint (tool_request.py built and checked it)
            req.sampling.structured_outputs = tool.constraint
        elif tool is not None and tool.tool_choice != "none":
            if not (st.enable_auto_tool_choice and st.tool_parser_cls is not None):
                raise P.bad_request(AUTO_NEEDS_FLAGS, "tool_choice")
            self.tool_cls = st.tool_parser_cls
        self.decode: MarkerDecoder | None = None

    def template_args(self) -> dict:
        """ChatTemplate.render's arguments besides `messages`."""
        return template_args(self.req)

    def output(self, prompt_text: str) -> Callable[[], ChoiceOutput] | None:
        if self.forced:
            tool = self.req.tool
            return lambda: ChoiceOutput(tools=NamedCall(tool.named) if tool.named else RequiredCalls(),
                                        parallel_tool_calls=tool.parallel_tool_calls,
                                        forced="named" if tool.named else "required")
        splitter: ThinkSplitter | None = reasoning_splitter(self.st.reasoning_parser, prompt_text,
                                                             self.req.template_kwargs)
        if splitter is None and self.tool_cls is None:
            return None
        markers = (*(splitter.tokens if splitter else ()), *(self.tool_cls.tokens() if self.tool_cls else ()))
        self.decode = self.st.decode_keeping(markers)
        tools, parallel, cls = self.req.tool.tools if self.req.tool else None, \
            self.req.tool.parallel_tool_calls if self.req.tool else True, self.tool_cls
        return lambda: ChoiceOutput(reasoning=splitter, tools=cls(tools) if cls is not None else None,
                                    parallel_tool_calls=parallel)


def marker_decoder(tokenizer, markers: tuple[str, ...]) -> MarkerDecoder | None:
    """A decode that keeps these marker tokens where the tokenizer calls them special (Kimi's and
    some Qwen tokenizers do; DeepSeek's tool tokens are not special) and still skips the other
    special tokens (end of sentence, ...); it also grows a choice's text step by step
    (marker_text.py). None when the usual decode keeps them already."""
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    keep = {i for m in markers if (i := tokenizer.token_to_id(m)) is not None} & special
    if not keep:
        return None
    return MarkerDecoder(tokenizer, frozenset(special - keep))


def template_args(req: P.ChatRequest) -> dict:
    """ChatTemplate.render's arguments besides `messages`, for /v1/chat/completions and /tokenize
    alike (chat_template_kwargs checked by protocol.py: no name the renderer sets itself)."""
    return {"add_generation_prompt": req.add_generation_prompt,
            "tools": req.tool.tools if req.tool is not None else None, "template_kwargs": req.template_kwargs}


def plan(st, req: P.ChatRequest) -> ChatPlan:
    return ChatPlan(st, req)
