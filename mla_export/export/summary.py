"""The end-of-export summary: time, file sizes, and what the latent cache saves per token."""

from __future__ import annotations

import shlex

from ..checkpoint.writer import RANDOM_WEIGHTS_NOTE
from ..formats.kv_formats import row_bytes
from .exporter import KV_DTYPES, ExportResult

__all__ = ["summary_lines", "next_lines"]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def summary_lines(result: ExportResult, wall_seconds: float | None = None) -> list[str]:
    """`wall_seconds`: the time the user waited (the command's, from its start); default: the
    export call's own time."""
    c = result.contract
    m, cache = c["model"], c["cache"]
    elem = KV_DTYPES[cache["dtype"]]
    latent = m["num_layers"] * row_bytes(cache["dtype"], m["kv_lora_rank"], m["qk_rope_head_dim"])
    index = cache.get("index")  # DeepSeek Sparse Attention's indexer keys: counted with the latent rows
    index_bytes = index["num_layers"] * row_bytes(cache["dtype"], index["row_width"], 0) if index else 0
    latent += index_bytes
    expanded = m["num_layers"] * m["num_heads"] * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"] + m["v_head_dim"]) * elem
    lines = [
        f"exported {m['model_type']} ({m['num_layers']} layers, {m['num_heads']} heads, vocab {m['vocab_size']}) "
        f"to {result.out_dir} in {result.seconds if wall_seconds is None else wall_seconds:.1f} s (peak RSS {result.peak_rss_mb:.0f} MiB)",
        _weights_line(c["export"]) + f"; cache {cache['dtype']}, block size {cache['block_size']}, "
        f"row width {cache['row_width']}",
        f"KV cache per token: {_size(latent)} latent"
        + (f" (of which {_size(index_bytes)} indexer keys)" if index else "")
        + f" vs {_size(expanded)} per-head expanded ({expanded / latent:.1f}x smaller)",
    ]
    if c.get("mtp"):  # the checkpoint's MTP layer, exported as a speculative-decoding draft
        files = ", ".join(f for f in (c["mtp"]["files"]["openvino_xml"], c["mtp"]["files"]["onnx"]) if f)
        lines.append(f"MTP draft (layer {c['mtp']['layer_index']}): {files}; serve with --speculative-config "
                     "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}' (docs/SERVING.md)")
    if c["export"].get("left_out"):
        lines.append(_left_out_line(c["export"]["left_out"]))
    if c["export"].get("random_weights"):
        lines.append(f"note: {RANDOM_WEIGHTS_NOTE}")
    lines += _resident_lines(c["export"], result)
    lines += [f"  {name:<24} {_size(size):>10}" for name, size in result.files.items()]
    return lines + next_lines(result)


def next_lines(result: ExportResult) -> list[str]:
    """The commands to run next on this export (the summary's last lines)."""
    out = shlex.quote(str(result.out_dir))
    if not result.contract.get("tokenizer"):  # no tokenizer: the model takes and gives token ids only
        prompt = "--prompt-ids 1,2,3"
    elif result.contract.get("chat_template"):
        prompt = "--chat --prompt 'Tell me a story.'"
    else:
        prompt = "--prompt 'Once upon a time'"
    return ["next:",
            f"  mla-export generate {out} {prompt} --max-tokens 32",
            f"  mla-export serve {out} --port 8000      # OpenAI-compatible API (docs/SERVING.md)"]


def _left_out_line(left_out: dict) -> str:
    """A multimodal checkpoint: only its text tower was exported."""
    def count(n: int) -> str:
        return f"{n / 1e6:.1f}M" if n >= 100_000 else str(n)

    parts = ", ".join(f"{module} ({g['tensors']} tensors, {count(g['params'])} params)"
                      for module, g in left_out.items())
    return f"text tower only: left out {parts}; image inputs are not supported"


def _weights_line(export: dict) -> str:
    fmt = export.get("weight_format", export["weight_dtype"])
    params = export.get("weight_params") or {}
    parts = ", ".join(f"{n / 1e6:.1f}M {kind}" for kind, n in sorted(params.items(), key=lambda kv: -kv[1]))
    groups = export.get("int4_group_sizes")
    rules = ", ".join(f"{r['rule']} ({len(r['weights'])} weights)" for r in export.get("tensor_formats") or ())
    return (f"weights {fmt}" + (f" recipe {export['recipe']}" if export.get("recipe") else "")
            + (f" ({parts})" if parts else "") + (f", int4 groups {groups}" if groups else "")
            + (f", rules {rules}" if rules else ""))


def _resident_lines(export: dict, result: ExportResult) -> list[str]:
    """What the weights will hold once compiled on this machine's CPU, and a warning where the plugin
    would widen 2-byte float weights to f32 (no native bf16/f16 here)."""
    try:
        from ..ops.memory_plan import native_float_types, resident_weight_bytes
        native = native_float_types()
    except Exception:  # no CPU device to ask (a build machine): say nothing rather than guess
        return []
    precision = "bf16" if "bf16" in native else "f32"
    need = resident_weight_bytes(export, precision, 0, native)
    lines = [f"compiled weights on this CPU: about {_size(need)} resident ({precision} inference precision)"]
    widened = {k for k in ("bf16", "f16") if (export.get("weight_params") or {}).get(k) and k not in native}
    if widened and export.get("weight_format") in ("bf16", "f16"):
        lines.append(f"note: this CPU has no native {'/'.join(sorted(widened))}: OpenVINO widens those weights to f32 "
                     "when it compiles (4 bytes each); --weight-format int8 keeps 1 byte per weight, int4 half")
    return lines
