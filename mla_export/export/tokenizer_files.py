"""Copying a checkpoint's tokenizer files into the export directory.

The runtime uses the `tokenizers` library only, so `tokenizer.json` is what makes text in/out
work; `tokenizer_config.json` carries the special tokens and usually the chat template, which
newer checkpoints keep in `chat_template.jinja` (or `chat_template.json`) instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["copy_tokenizer_files"]

_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
          "special_tokens_map.json", "generation_config.json", "config.json")


def _token_text(value):
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _check_tokenizer(path: Path) -> None:
    """The runtime loads tokenizer.json with `tokenizers`: a file it cannot load is refused now,
    naming the file, rather than copied and failing at the first request."""
    from tokenizers import Tokenizer

    from ..checkpoint.config import ConfigError

    try:
        Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception types
        raise ConfigError(f"{path}: not a tokenizer the runtime can load ({str(e).splitlines()[0][:200]})") from None


def copy_tokenizer_files(src: Path, dst: Path) -> tuple[dict | None, str | None]:
    """Copy the files that exist; returns (the contract's tokenizer entry or None, chat template or None)."""
    src, dst = Path(src), Path(dst)
    for name in _FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    config, template = {}, None
    if (src / "tokenizer_config.json").is_file():
        try:
            config = json.loads((src / "tokenizer_config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            from ..checkpoint.config import ConfigError

            raise ConfigError(f"{src / 'tokenizer_config.json'}: not valid JSON ({e})") from None
        template = config.get("chat_template")
    if (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text()
    elif (src / "chat_template.json").is_file():
        template = json.loads((src / "chat_template.json").read_text()).get("chat_template", template)
    if isinstance(template, list):  # named templates: keep the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not (src / "tokenizer.json").is_file():
        return None, template
    _check_tokenizer(src / "tokenizer.json")
    entry = dict(file="tokenizer.json",
                 config="tokenizer_config.json" if (src / "tokenizer_config.json").is_file() else None,
                 bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")))
    return entry, template
