"""Chat template rendering (Hugging Face conventions) for `POST /v1/chat/completions`.

The template is a Jinja2 string, rendered in a sandbox as `transformers` does: `messages`,
`tools` (the request's OpenAI function tools, or None), `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception(msg)`, `strftime_now(fmt)`, the `tojson` filter, `trim_blocks` and
`lstrip_blocks`, and the request's `chat_template_kwargs` as further variables (over bos_token /
eos_token, as transformers lets them; the names the renderer sets itself are refused where the
request is parsed, protocol.py). The rendered text is tokenized without adding special tokens
(the template writes them), as `apply_chat_template` does.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

__all__ = ["ChatTemplate", "TemplateError", "load_chat_template"]


class TemplateError(ValueError):
    """The template failed on a request; `param` is the request field to blame (a 400 names it)."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


# Variables the renderer sets itself: chat_template_kwargs may not hold them (protocol.py refuses).
RENDERER_VARIABLES = ("messages", "tools", "add_generation_prompt", "raise_exception", "strftime_now")


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # pragma: no cover - jinja2 ships with the serve extra
            raise RuntimeError("chat templates need jinja2 (pip install jinja2)") from e

        def raise_exception(message):
            raise TemplateError(str(message))

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template does not compile: {e}") from e
        self._jinja_error = jinja2.TemplateError
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               template_kwargs: dict | None = None) -> str:
        """The prompt text. The request's template_kwargs are a dict of variables, never Python
        keyword arguments (a key "self" once collided with this method's own). Any failure is a
        TemplateError blaming `chat_template_kwargs` when the render succeeds without them, else
        `messages`."""
        extra = dict(template_kwargs or {})
        try:
            return self._render(messages, add_generation_prompt, tools, extra)
        except TemplateError as e:
            if extra and e.param == "messages":
                try:
                    self._render(messages, add_generation_prompt, tools, {})
                except TemplateError:
                    raise e from None
                raise TemplateError(f"chat_template_kwargs: {e}", "chat_template_kwargs") from None
            raise

    def _render(self, messages, add_generation_prompt, tools, extra: dict) -> str:
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
               "messages": messages, "add_generation_prompt": add_generation_prompt, "tools": tools}
        try:
            return self._template.render(ctx)
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError("the chat template failed: it recursed too deeply") from None
        except Exception as e:  # noqa: BLE001 - a template is code the request drives: any failure is the request's
            raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:  # template text longer than a file name can be (ENAMETOOLONG)
        return False


def load_chat_template(model_dir: str | Path, contract_value, override: str | Path | None = None) -> str | None:
    """The template source: `override` (a file, or the template text itself when it is not a
    file), else the contract's `chat_template` entry (the template text, or the name of a file
    in the model directory), else `chat_template.jinja` / tokenizer_config.json's
    `chat_template` in the model directory; None when there is none."""
    model_dir = Path(model_dir) if model_dir is not None else None
    if override is not None:
        p = Path(override)
        if _is_file(p):
            return p.read_text(encoding="utf-8")
        if "{" in str(override):
            return str(override)
        raise FileNotFoundError(f"chat template file not found: {override}")
    if isinstance(contract_value, dict):  # {"file": name} or {"template": text}
        contract_value = contract_value.get("template") or contract_value.get("file")
    if model_dir is None:
        return contract_value if isinstance(contract_value, str) and "{" in contract_value else None
    if isinstance(contract_value, str) and contract_value:
        if "{" not in contract_value:  # a file name: it must stay inside the export
            from ..formats.export_paths import inside

            p = inside(model_dir, contract_value, "chat_template")
        if "{" not in contract_value and p.is_file():
            return p.read_text(encoding="utf-8")
        if "{" in contract_value:
            return contract_value
    for name in ("chat_template.jinja",):
        p = model_dir / name
        if p.is_file():
            return p.read_text(encoding="utf-8")
    cfg = model_dir / "tokenizer_config.json"
    if cfg.is_file():
        try:
            value = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, json.JSONDecodeError):
            value = None
        if isinstance(value, str) and value:
            return value
    return None
