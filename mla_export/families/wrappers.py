"""Multimodal checkpoints whose text tower is an MLA model this exporter reads: the text tower's
config (`text_config`) and weights are exported, the vision tower and projector are left out.

- `mistral3` (Mistral Small 4 as released): a Pixtral vision tower and a `mistral4` text tower.
  Its weights sit under `language_model.model.` (the released layout; transformers saves it so
  too) or `model.language_model.` (transformers' module names), the head under `lm_head.` or
  `language_model.lm_head.`. transformers ties the head to the embedding by the top-level
  `tie_word_embeddings` (default true), not the text config's.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WRAPPERS", "unwrap"]


@dataclass(frozen=True)
class Wrapper:
    text_types: tuple[str, ...]  # text towers read here
    prefixes: tuple  # ((our prefix, (the checkpoint's candidate prefixes, ...)), ...)
    top_level: dict  # keys the top level decides (transformers' default when absent)


WRAPPERS = {
    "mistral3": Wrapper(
        text_types=("mistral4",),
        prefixes=(("model.", ("language_model.model.", "model.language_model.")),
                  ("lm_head.", ("lm_head.", "language_model.lm_head."))),
        top_level={"tie_word_embeddings": True}),
}


def unwrap(raw: dict, error) -> tuple[dict, tuple | None]:
    """(the config the text tower's family reads, the weight prefixes) of a wrapper; (raw, None)
    for any other config.json."""
    model_type = raw.get("model_type")
    w = WRAPPERS.get(model_type) if isinstance(model_type, str) else None
    if w is None:
        return raw, None
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise error(f"config.json: a {raw['model_type']} checkpoint needs its text tower's text_config, got {text!r}")
    if not isinstance(text.get("model_type"), str) or text["model_type"] not in w.text_types:
        raise error(f"config.json: text_config.model_type {str(text.get('model_type'))[:60]!r} is not an MLA text tower this "
                    f"exporter reads inside {raw['model_type']} (it reads {', '.join(w.text_types)})")
    inner = dict(text)
    for key, default in w.top_level.items():
        inner[key] = raw.get(key, default)
    if raw.get("quantization_config") is not None:  # a quantized release says it at the top level
        inner["quantization_config"] = raw["quantization_config"]
    return inner, w.prefixes
