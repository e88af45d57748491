"""A model's recommended sampling defaults: its `generation_config.json` (vLLM's
`--generation-config auto`, the default of `vllm serve` and `LLM`).

vLLM takes temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens from it as the
defaults of every request that does not give them; "vllm" ignores the file (SamplingParams' own
defaults); a directory reads that directory's generation_config.json instead of the model's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["GENERATION_DEFAULTS", "read_generation_defaults"]

# generation_config.json key -> SamplingParams field (vLLM's list)
GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                       "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def read_generation_defaults(source: str | Path, out_dir: str | Path) -> dict:
    """{SamplingParams field: value} from `source` ("auto": OUT_DIR's generation_config.json,
    "vllm": none, or a directory holding one). A malformed file or value raises ValueError naming
    the file and key; a missing file under "auto" means no defaults (as in vLLM)."""
    if source == "vllm":
        return {}
    if source == "auto":
        path = Path(out_dir) / "generation_config.json"
        if not path.is_file():
            return {}
    else:
        path = Path(source) / "generation_config.json"
        if not path.is_file():
            raise ValueError(f"generation config: {path} does not exist (give 'auto', 'vllm' or a directory "
                             "holding a generation_config.json)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    given = {}
    for theirs, ours in GENERATION_DEFAULTS.items():
        v = raw.get(theirs)
        if v is None:
            continue
        integral = ours in ("top_k", "max_tokens")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integral and not isinstance(v, int)) \
                or not math.isfinite(v):
            raise ValueError(f"{path}: {theirs} must be {'an integer' if integral else 'a number'}, got {v!r}")
        given[ours] = v
    return given
