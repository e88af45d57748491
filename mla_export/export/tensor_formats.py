"""Per-tensor formats for int4 exports: `--tensor-format PATTERN=FORMAT` (llama-quantize's
`--tensor-type`, NNCF's mixed precision by name).

PATTERN is a Python regular expression searched in the checkpoint names a stored weight is made
of: a projection's own name (`model.layers.3.mlp.down_proj.weight`), lm_head's, the embedding
table's, and for routed experts every expert's gate/up (the w13 operand) or down (w2) name. The
fused MoE op and the stacked expert tensors hold one format per projection for all experts, and
gate and up are stored as one tensor: a pattern must then match all of a stored tensor's names or
none (TensorFormatError names the split). The first PATTERN that matches decides (llama-quantize's
order). FORMAT: int8 (per output channel) or int4 (per --group-size group).

Weights kept float in every format (norms, routers, kv_b_proj's absorbed halves, which the
attention op reads) take no format: a pattern that matches only those is refused after the graph
is built (the exporter), as one that matches no checkpoint tensor is up front.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TensorFormat", "TensorFormatError", "OVERRIDE_BITS", "parse_tensor_formats"]

OVERRIDE_BITS = {"int8": 8, "int4": 4}


class TensorFormatError(ValueError):
    """A --tensor-format that cannot be applied as given (the message names it)."""


@dataclass(frozen=True)
class TensorFormat:
    text: str  # PATTERN=FORMAT as the user gave it
    pattern: re.Pattern
    fmt: str
    required: bool = True  # must decide some weight (a user's rule; a named recipe's need not)

    @property
    def bits(self) -> int:
        return OVERRIDE_BITS[self.fmt]

    def choose(self, name: str, sources: tuple[str, ...]) -> bool:
        """Whether this rule decides the stored weight `name` made of the checkpoint tensors
        `sources`: all of them match (True), none (False), or some (TensorFormatError)."""
        hit = [s for s in sources if self.pattern.search(s)]
        if hit and len(hit) != len(sources):
            missed = next(s for s in sources if not self.pattern.search(s))
            raise TensorFormatError(
                f"--tensor-format {self.text!r} matches {hit[0]} but not {missed}, which are stored together as "
                f"one tensor ({name}: one format for gate and up, and for all experts of a projection); "
                "use a pattern that takes all of them or none")
        return bool(hit)


def parse_tensor_formats(specs, required: bool = True) -> tuple[TensorFormat, ...]:
    """The rules from `--tensor-format` values, in order; TensorFormatError names a bad one."""
    if specs is None:
        return ()
    if isinstance(specs, str) or not isinstance(specs, (list, tuple)):
        raise TensorFormatError(f"--tensor-format values must be a list of PATTERN=FORMAT strings, got {specs!r}")
    rules = []
    for spec in specs:
        if not isinstance(spec, str) or "=" not in spec:
            raise TensorFormatError(f"--tensor-format {spec!r}: give PATTERN=FORMAT (e.g. 'down_proj=int8')")
        text, fmt = spec.rsplit("=", 1)
        if not text:
            raise TensorFormatError(f"--tensor-format {spec!r}: the PATTERN before '=' is empty")
        if fmt not in OVERRIDE_BITS:
            raise TensorFormatError(f"--tensor-format {spec!r}: FORMAT must be {' or '.join(OVERRIDE_BITS)}, got {fmt!r}")
        try:
            pattern = re.compile(text)
        except re.error as e:
            raise TensorFormatError(f"--tensor-format {spec!r}: {text!r} is not a regular expression ({e})") from None
        rules.append(TensorFormat(spec, pattern, fmt, required))
    return tuple(rules)
