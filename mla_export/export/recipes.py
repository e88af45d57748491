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
    # issue 34: Q4_K_M's quality at fewer bytes per token (docs/WEIGHTS.md, "Mixed int4/int8").
    "int4-mixed": Recipe(
        group_size=32,
        tensor_formats=("shared_experts=int4", "down_proj=int8", "lm_head=int4"),
        about="int4 in groups of 32, the down projections of the dense MLP and the routed experts int8, "
              "lm_head int4"),
}
