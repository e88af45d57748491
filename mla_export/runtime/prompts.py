"""`LLM.generate`'s `prompts` argument -> the engine's prompts (text or a list of token ids).

The forms vLLM's `LLM.generate` takes: a string, vLLM's TextPrompt `{"prompt": str}` and
TokensPrompt `{"prompt_token_ids": [int, ...]}` dicts, or a list (or tuple) of those; and this
package's own: a flat list of token ids (one prompt), lists of token ids, a 1-D numpy array
(one prompt) or a 2-D one (a prompt per row). Anything else is refused here, naming `prompts`
(and the index of the bad entry): a dict of other keys, a set, bytes, a generator, a number,
an entry of the wrong type. Before, `list(prompts)` took any iterable, so a set's elements
became prompts in hash order and bytes became token ids.
"""

from __future__ import annotations

import numpy as np

__all__ = ["engine_prompts"]

_FORMS = ("a string, a list of token ids, vLLM's {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
          "or a list of those")


def engine_prompts(prompts) -> list:
    """Each prompt as the engine takes it: a str or a list of ints (their range is the engine's check)."""
    if isinstance(prompts, (str, dict)):
        return [_one(prompts, "prompts")]
    if isinstance(prompts, np.ndarray):
        if prompts.ndim == 1:
            return [_token_ids(prompts, "prompts")]
        if prompts.ndim == 2:
            return [_token_ids(row, f"prompts[{i}]") for i, row in enumerate(prompts)]
        raise ValueError(f"prompts: a numpy array of prompts must be 1-D (one prompt) or 2-D (one per row), "
                         f"got shape {prompts.shape}")
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be {_FORMS}; got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts: no prompts given")
    if all(_is_token_id(p) for p in prompts):  # one prompt of token ids
        return [_token_ids(prompts, "prompts")]
    return [_one(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


def _one(p, where: str):
    if isinstance(p, str):
        return p
    if isinstance(p, dict):
        keys = set(p)
        if keys == {"prompt"}:
            if not isinstance(p["prompt"], str):
                raise TypeError(f"{where}['prompt'] must be a string, got {type(p['prompt']).__name__}")
            return p["prompt"]
        if keys == {"prompt_token_ids"}:
            return _token_ids(p["prompt_token_ids"], f"{where}['prompt_token_ids']")
        shown = sorted(repr(k) for k in keys)[:5]
        raise ValueError(f"{where}: a prompt dict holds exactly one of 'prompt' or 'prompt_token_ids' (multimodal "
                         f"data and the other keys are not supported), got keys {', '.join(shown) or 'none'}")
    if isinstance(p, (list, tuple, np.ndarray)):
        return _token_ids(p, where)
    raise TypeError(f"{where} must be {_FORMS}; got {type(p).__name__}")


def _token_ids(seq, where: str) -> list:
    if isinstance(seq, np.ndarray):
        if seq.ndim != 1:
            raise ValueError(f"{where}: token ids must be 1-D, got shape {seq.shape}")
        if seq.size and (not np.issubdtype(seq.dtype, np.integer) or seq.dtype == np.bool_):
            raise ValueError(f"{where}: token ids must be integers, got dtype {seq.dtype}")
        return seq.tolist()
    if not isinstance(seq, (list, tuple)):
        raise TypeError(f"{where} must be a list of integer token ids, got {type(seq).__name__}")
    for bad in seq:
        if not _is_token_id(bad):
            raise ValueError(f"{where}: token ids must be integers, got {type(bad).__name__} {bad!r:.40}")
    return [int(t) for t in seq]


def _is_token_id(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
