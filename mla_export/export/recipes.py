"""Named int4 recipes (`mla-export export --recipe NAME`): a group size and --tensor-format rules
chosen by measurement, so users need not find them. docs/WEIGHTS.md has the table each was picked
from (KL divergence from the 16-bit base and weight bytes per decode token, against llama.cpp's
Q4_K_M on the same checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Recipe", "RECIPES"]


@dataclass(frozen=True)
class Recipe:
    group_size: int
    tensor_formats: tuple[str, ...]
    about: str


RECIPES = {
    # issue 34: below llama.cpp's Q4_K_M on both KL divergence and bytes per decode token on the
    # 3-layer V2-Lite-shaped checkpoint (docs/WEIGHTS.md, "Per-tensor formats"). The attention
    # projections (q / q_a / q_b, kv_a, o) were the most int4-sensitive weights there by far; int4
    # lm_head pays for them.
    "int4-mixed": Recipe(
        group_size=128,
        tensor_formats=("self_attn=int8", "lm_head=int4"),
        about="int4 in groups of 128, the attention projections int8, lm_head int4"),
}
