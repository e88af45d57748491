"""Exported tiny models for the runtime tests, made once per test session, and transformers'
own greedy `generate` as the oracle (torch is imported only here, never by the runtime)."""

from __future__ import annotations

from pathlib import Path

_EXPORTS: dict[tuple, tuple[Path, Path]] = {}
_HF: dict[Path, object] = {}

SEEDS = {"deepseek_v3": 11, "deepseek_v2": 12}


def exported_model(tmp_path_factory, model_type: str = "deepseek_v3", kv_dtype: str = "f32",
                   block_size: int = 4) -> tuple[Path, Path]:
    """(checkpoint dir, export dir) of a tiny random `model_type` checkpoint exported to OpenVINO IR."""
    key = (model_type, kv_dtype, block_size)
    if key not in _EXPORTS:
        from mla_export.cli import main
        from mla_export.presets import make_checkpoint

        root = tmp_path_factory.mktemp(f"rt_{model_type}_{kv_dtype}_{block_size}")
        ckpt = next((c for (mt, _, _), (c, _) in _EXPORTS.items() if mt == model_type), None)
        if ckpt is None:
            ckpt = make_checkpoint(root / "ckpt", model_type, seed=SEEDS[model_type])
        out = root / "export"
        code = main(["export", str(ckpt), "-o", str(out), "--format", "openvino",
                     "--block-size", str(block_size), "--kv-dtype", kv_dtype])
        assert code == 0, f"export of {model_type} failed with exit code {code}"
        _EXPORTS[key] = (ckpt, out)
    return _EXPORTS[key]


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
