"""The model families the exporter reads: one file each, registered here by model_type.

`family(model_type)` returns the `Family` that reads that type's config.json; an unknown or
unsupported type raises `ValueError` naming what blocks it. To add a family: a file with a
`Family` subclass (defaults + what differs from DeepSeek-V3) and `FAMILIES = (...)`, listed below.
"""

from __future__ import annotations

from . import axk1, deepseek, dsa, longcat_flash, minicpm3, mistral4, youtu
from .base import Block, Family, SparseAttention
from .unsupported import UNSUPPORTED

__all__ = ["Block", "Family", "SparseAttention", "FAMILIES", "UNSUPPORTED", "family", "supported_model_types"]

FAMILIES: dict[str, Family] = {}
for _module in (deepseek, youtu, axk1, minicpm3, mistral4, longcat_flash, dsa):
    for _fam in _module.FAMILIES:
        for _t in _fam.model_types:
            FAMILIES[_t] = _fam


def supported_model_types() -> tuple[str, ...]:
    from .wrappers import WRAPPERS  # multimodal checkpoints whose text tower is read

    return tuple(FAMILIES) + tuple(WRAPPERS)


def family(model_type) -> Family:
    if not isinstance(model_type, str):  # config.json is untrusted: a list or object here is not a name
        raise ValueError(f"config.json: model_type must be a string, got {type(model_type).__name__}")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    listed = ", ".join(FAMILIES)
    if model_type in UNSUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not supported: {UNSUPPORTED[model_type]} "
                         f"(supported: {listed}; see docs/MODELS.md)")
    raise ValueError(f"unsupported model_type {model_type!r}: this exporter converts MLA models of types {listed} "
                     "(see docs/MODELS.md)")
