"""A chat conversation -> prompt token ids, with the export's chat template (Hugging Face
conventions, rendered by `mla_export.runtime.chat_template.ChatTemplate`), for `LLM.chat()` and
`mla-export generate --chat`. Needs jinja2 (a base dependency)."""

from __future__ import annotations

from ..deps import require

__all__ = ["ChatPrompter", "check_messages"]


def check_messages(messages, where: str = "messages") -> list[dict]:
    """A conversation: a non-empty list of {"role": str, "content": str} dicts; a content given as
    OpenAI-style parts is joined when every part is text, and refused naming the first other part
    (an image would otherwise be dropped without a word: the exported model reads text only)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} dicts")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            m = dict(m, content=_text_of_parts(m["content"], f"{where}[{i}]['content']"))
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}[{i}] must be a dict with string 'role' and 'content', got {m!r}")
        out.append(dict(m))
    return out


def _text_of_parts(parts: list, where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            if kind is not None and kind != "text":
                raise ValueError(f"{where}[{j}]: {kind!r} content is not supported: the exported model reads text "
                                 "only (a multimodal checkpoint's vision tower is not exported)")
            raise ValueError(f"{where}[{j}] must be {{'type': 'text', 'text': <string>}}, got {part!r}")
        texts.append(part["text"])
    return "".join(texts)


class ChatPrompter:
    """The engine's chat template (or `template`: a file or the template text) bound to its
    tokenizer's BOS/EOS strings."""

    def __init__(self, engine, template: str | None = None):
        require("jinja2", "chat templates")
        from .chat_template import ChatTemplate, load_chat_template

        if engine.tokenizer is None:
            raise ValueError("this model directory has no tokenizer, so it cannot take chat messages")
        contract = engine.contract
        source = load_chat_template(contract.out_dir, contract.chat_template, template)
        if source is None:
            raise ValueError(f"{contract.out_dir} has no chat template; pass one (a Jinja2 file) explicitly")
        tok = contract.raw.get("tokenizer") or {}
        model = contract.model

        def token_str(key):
            ids = model.get(key)
            ids = ids[0] if isinstance(ids, list) and ids else ids
            return engine.tokenizer.id_to_token(int(ids)) if isinstance(ids, int) else None

        self.tokenizer = engine.tokenizer
        self.template = ChatTemplate(source, bos_token=tok.get("bos_token") or token_str("bos_token_id"),
                                     eos_token=tok.get("eos_token") or token_str("eos_token_ids"))

    def prompt_ids(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """The rendered conversation's token ids; the template writes the special tokens, so
        none are added (as transformers' apply_chat_template does)."""
        text = self.template.render(check_messages(messages), add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
