"""The end-of-export summary: time, file sizes, and what the latent cache saves per token."""

from __future__ import annotations

from .exporter import KV_DTYPES, ExportResult

__all__ = ["summary_lines"]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def summary_lines(result: ExportResult) -> list[str]:
    c = result.contract
    m, cache = c["model"], c["cache"]
    elem = KV_DTYPES[cache["dtype"]]
    latent = m["num_layers"] * cache["row_width"] * elem
    expanded = m["num_layers"] * m["num_heads"] * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"] + m["v_head_dim"]) * elem
    lines = [
        f"exported {m['model_type']} ({m['num_layers']} layers, {m['num_heads']} heads, vocab {m['vocab_size']}) "
        f"to {result.out_dir} in {result.seconds:.1f} s (peak RSS {result.peak_rss_mb:.0f} MiB)",
        f"weights {c['export']['weight_dtype']}; cache {cache['dtype']}, block size {cache['block_size']}, "
        f"row width {cache['row_width']}",
        f"KV cache per token: {_size(latent)} latent vs {_size(expanded)} per-head expanded "
        f"({expanded / latent:.1f}x smaller)",
    ]
    lines += [f"  {name:<24} {_size(size):>10}" for name, size in result.files.items()]
    return lines
