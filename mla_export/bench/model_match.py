"""Whether an export directory (`mla-export bench --export-dir`) and the checkpoint the other
systems run are the same model: a benchmark that compares two different models must not run.

The export's own record says what it was made from (mla_graph.json export.source, the
checkpoint directory as the exporter resolved it): the checkpoint given must be that directory
or a copy of it (the same config.json and the same safetensors files by name and size). When
that directory no longer exists (a temporary one: the tiny preset) only the model dimensions
can be compared, and the report says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# config.json fields that make two checkpoints different models (their shapes and routing)
FIELDS = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
          "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "vocab_size", "n_routed_experts",
          "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "intermediate_size",
          "first_k_dense_replace", "max_position_embeddings")


class ModelMismatch(ValueError):
    """The export and the checkpoint are not the same model (the message names both)."""


def _config(d: Path, what: str) -> dict:
    try:
        return json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelMismatch(f"{what} {d}: cannot read its config.json ({e})") from None


def export_source(export_dir: Path) -> str | None:
    """The checkpoint directory the export records it was made from (None when it does not say)."""
    try:
        src = json.loads((export_dir / "mla_graph.json").read_text())["export"].get("source")
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return src if isinstance(src, str) and src else None


def _weights(d: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in d.glob("*.safetensors")}


def _same_checkpoint(a: Path, b: Path) -> bool:
    """`a` and `b` are one directory, or copies: the same config.json bytes and safetensors files."""
    try:
        if os.path.samefile(a, b):
            return True
        return ((a / "config.json").read_bytes() == (b / "config.json").read_bytes()
                and _weights(a) == _weights(b) and bool(_weights(a)))
    except OSError:
        return False


def check(export_dir: Path, checkpoint: Path) -> str:
    """Raise ModelMismatch when the export is not a model of `checkpoint`; else one line saying
    how far that was verified (for the report)."""
    exp, ck = _config(export_dir, "--export-dir"), _config(checkpoint, "--checkpoint")
    diff = [f"{k} {exp.get(k)!r} vs {ck.get(k)!r}" for k in FIELDS if exp.get(k) != ck.get(k)]
    if diff:
        raise ModelMismatch(f"--export-dir {export_dir} is not a model of --checkpoint {checkpoint}: "
                            f"{'; '.join(diff)} (export vs checkpoint). Benchmark the export alone "
                            f"(--systems ours), or pass the checkpoint it was exported from")
    src = export_source(export_dir)
    if src is None:
        return f"{export_dir} does not record its source checkpoint: only the model dimensions were compared"
    if not Path(src).is_dir():
        return (f"{export_dir} was exported from {src}, which no longer exists: only the model dimensions "
                f"were compared with {checkpoint}")
    if not _same_checkpoint(Path(src), checkpoint):
        raise ModelMismatch(f"--export-dir {export_dir} was exported from {src}, not from --checkpoint "
                            f"{checkpoint} (their config.json or safetensors files differ): the systems would "
                            f"run different weights. Pass --checkpoint {src}")
    return f"{export_dir} was exported from {src}, the checkpoint the other systems run"


def need_checkpoint_message(export_dir: Path, others: list[str]) -> str:
    """--export-dir with systems that need a checkpoint, and none given."""
    src = export_source(export_dir)
    where = (f"; the export records {src}: pass --checkpoint {src}" if src and Path(src).is_dir() else
             f"; the export was made from {src}, which no longer exists" if src else "")
    return (f"--export-dir {export_dir} runs as system 'ours' only; {', '.join(others)} run a checkpoint, "
            f"which must be the one {export_dir} was exported from: pass it with --checkpoint{where} "
            f"(or run --systems ours alone)")
