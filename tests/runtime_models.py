"""transformers' own greedy `generate` as the oracle of the runtime tests (torch is imported
only here, never by the runtime). The exports themselves: tests/exports.py."""

from __future__ import annotations

from pathlib import Path

_HF: dict[Path, object] = {}


def hf_greedy(ckpt: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate (float32), stopping at eos as it does by default."""
    import torch
    from transformers import AutoModelForCausalLM

    if ckpt not in _HF:
        _HF[ckpt] = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    model = _HF[ckpt]
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=model.generation_config.eos_token_id)
    return out[0, len(prompt):].tolist()
