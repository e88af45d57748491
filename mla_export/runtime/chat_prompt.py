"""A chat conversation -> prompt token ids, with the export's chat template (Hugging Face
conventions, rendered by `mla_export.server.chat.ChatTemplate`), for `LLM.chat()` and
`mla-export generate --chat`. Needs jinja2 (the `serve` extra)."""

from __future__ import annotations

from ..deps import require

__all__ = ["ChatPrompter", "check_messages"]


def check_messages(messages, where: str = "messages") -> list[dict]:
    """A conversation: a non-empty list of {"role": str, "content": str} dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}[{i}] must be a dict with string 'role' and 'content', got {m!r}")
    return [dict(m) for m in messages]


class ChatPrompter:
    """The engine's chat template (or `template`: a file or the template text) bound to its
    tokenizer's BOS/EOS strings."""

    def __init__(self, engine, template: str | None = None):
        require("jinja2", "chat templates")
        from ..server.chat import ChatTemplate, load_chat_template

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
