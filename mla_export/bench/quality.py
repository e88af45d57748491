"""Quality at equal bits: how far a quantised model's next-token distributions move from its
16-bit base, measured the way llama.cpp's `llama-perplexity --kl-divergence` does, so that a speed
ratio at 8 or 4 bits can be read beside what those bits cost.

For each system the text is cut into chunks of `ctx` tokens (each chunk's first token replaced by
BOS, evaluated from an empty cache, as llama-perplexity does); the logits of the chunk's second
half (positions ctx/2 .. ctx-2, each predicting the next token) are compared with the base's at
the same positions: KL(base || quantised) per position in float64, and whether both put the same
token on top. Reported: mean (with its standard error), median, 99th percentile and maximum KLD,
and "same top" (the share of positions whose argmax agrees), under llama-perplexity's names.

Ours: the base is an export with bf16 weights run at the f32 hint (no rounding but the weights');
the quantised exports run at the precision users run (default bf16: int8 activation dots).
Peers: `llama-perplexity` of the peer (ik_llama.cpp's, or mainline's when built) on its own BF16
GGUF (`--kl-divergence-base`) and on each quantised GGUF (`--kl-divergence`). Each system
tokenises the text with its own tokenizer (llama.cpp's GGUF pre-tokenizer cuts this checkpoint's
synthetic vocabulary differently), so the positions differ; the statistics are per position.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

__all__ = ["KLDStats", "kld_rows", "chunk_logits", "our_kld", "parse_llama_perplexity"]


def kld_rows(base: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of two [n, vocab] logit arrays: KL(softmax(base) || softmax(other)) in float64, and
    whether their argmax agrees. Non-finite logits are refused (a NaN would hide in a mean)."""
    if base.shape != other.shape or base.ndim != 2:
        raise ValueError(f"kld_rows: logits must be two [n, vocab] arrays of one shape, got {base.shape} and {other.shape}")
    for name, a in (("base", base), ("other", other)):
        if not np.isfinite(a).all():
            raise ValueError(f"kld_rows: {name} logits hold NaN or infinity")
    lp = _log_softmax(base.astype(np.float64))
    lq = _log_softmax(other.astype(np.float64))
    kld = np.maximum((np.exp(lp) * (lp - lq)).sum(axis=1), 0.0)  # >= 0 in exact arithmetic
    return kld, base.argmax(axis=1) == other.argmax(axis=1)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@dataclass
class KLDStats:
    """The running figures of one system against its base."""

    klds: list = field(default_factory=list)
    same: list = field(default_factory=list)

    def add(self, kld: np.ndarray, same_top: np.ndarray) -> None:
        self.klds.append(np.asarray(kld, np.float64))
        self.same.append(np.asarray(same_top, bool))

    def summary(self) -> dict:
        k = np.concatenate(self.klds) if self.klds else np.zeros(0)
        s = np.concatenate(self.same) if self.same else np.zeros(0, bool)
        n = int(k.size)
        if n == 0:
            raise ValueError("no positions were compared (text shorter than one chunk?)")
        frac = float(s.mean())
        return {"positions": n, "mean_kld": float(k.mean()),
                "mean_kld_err": float(k.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
                "median_kld": float(np.median(k)), "p99_kld": float(np.percentile(k, 99)), "max_kld": float(k.max()),
                "same_top_pct": 100.0 * frac, "same_top_err_pct": 100.0 * math.sqrt(frac * (1 - frac) / n)}


def chunks_of(token_ids: Sequence[int], ctx: int, max_chunks: int | None, bos: int | None) -> list[list[int]]:
    """The text's tokens cut into whole chunks of ctx (the tail that does not fill one is dropped,
    as llama-perplexity does), each chunk's first token replaced by BOS when the model has one."""
    if ctx < 4:
        raise ValueError(f"ctx must be at least 4 tokens, got {ctx}")
    n = len(token_ids) // ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    if n == 0:
        raise ValueError(f"the text has {len(token_ids)} tokens: fewer than one chunk of ctx={ctx}")
    out = []
    for c in range(n):
        chunk = [int(t) for t in token_ids[c * ctx:(c + 1) * ctx]]
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def chunk_logits(backend, chunk: Sequence[int]) -> np.ndarray:
    """The logits of one chunk's scored positions (ctx/2 .. ctx-2), the chunk run from an empty
    cache in one prefill step that returns those rows (`num_logits`, metadata.py)."""
    ctx = len(chunk)
    first = ctx // 2
    block_size = backend.layout.block_size
    blocks = list(range(-(-ctx // block_size)))
    rows = backend.execute([ctx], [ctx], [blocks], np.asarray(chunk, np.int64), num_logits=[ctx - first])
    return np.array(rows[:ctx - first - 1], np.float32)  # the last row predicts past the chunk: unused


def export_backend(export_dir: str | Path, ctx: int, precision: str, runtime: str, threads: int | None):
    """A backend with just the blocks one chunk needs (no engine: no sampling, no scheduler)."""
    from ..runtime.backend import MLABackend
    from ..runtime.model_dir import load_model_dir

    contract, facts = load_model_dir(export_dir)
    if ctx > facts.max_model_len:
        raise ValueError(f"ctx {ctx} exceeds {export_dir}'s max model length {facts.max_model_len}")
    backend = MLABackend(contract, -(-ctx // facts.block_size), runtime=runtime, precision=precision,
                         num_threads=threads)
    return backend, facts, contract.model.get("bos_token_id")


def tokenize_text(facts, text: str) -> list[int]:
    tok = facts.load_tokenizer()
    if tok is None:
        raise ValueError("the export has no tokenizer: pass token ids instead of text")
    return tok.encode(text, add_special_tokens=False).ids


def _chunk_rows(export_dir, token_ids, ctx, max_chunks, precision, runtime, threads) -> Iterator[np.ndarray]:
    backend, _, bos = export_backend(export_dir, ctx, precision, runtime, threads)
    for chunk in chunks_of(token_ids, ctx, max_chunks, bos):
        yield chunk_logits(backend, chunk)


def our_kld(base_dir, others: dict, *, text: str | None = None, token_ids: Sequence[int] | None = None, ctx: int = 512,
            max_chunks: int | None = None, base_precision: str = "f32", precision: str = "bf16",
            runtime: str = "openvino", threads: int | None = None) -> dict:
    """{name: KLDStats.summary()} of each export in `others` ({name: export dir}) against the base
    export, on the same tokens (the base's tokenizer; every export of one checkpoint shares it).
    The base's rows are kept per chunk in memory ([ctx/2, vocab] f32 each) while the others run."""
    if (text is None) == (token_ids is None):
        raise ValueError("give either text or token_ids")
    if token_ids is None:
        from ..runtime.model_dir import load_model_dir

        token_ids = tokenize_text(load_model_dir(base_dir)[1], text)
    base_rows = list(_chunk_rows(base_dir, token_ids, ctx, max_chunks, base_precision, runtime, threads))
    out = {}
    for name, d in others.items():
        stats = KLDStats()
        for b, rows in zip(base_rows, _chunk_rows(d, token_ids, ctx, max_chunks, precision, runtime, threads)):
            if rows.shape != b.shape:
                raise ValueError(f"{name}: logits {rows.shape} against the base's {b.shape}: not the same model")
            stats.add(*kld_rows(b, rows))
        out[name] = stats.summary()
    return out


# --------------------------------------------------------------------------------- llama-perplexity
_NUM = r"(-?[0-9.]+(?:e[-+]?\d+)?)"
_PATTERNS = {
    "mean_kld": re.compile(r"^Mean\s+KLD:\s*" + _NUM + r"\s*±\s*" + _NUM, re.M),
    "median_kld": re.compile(r"^Median\s+KLD:\s*" + _NUM, re.M),
    "p99_kld": re.compile(r"^99\.0%\s+KLD:\s*" + _NUM, re.M),
    "max_kld": re.compile(r"^Maximum\s+KLD:\s*" + _NUM, re.M),
    "same_top_pct": re.compile(r"^Same top p:\s*" + _NUM + r"\s*±\s*" + _NUM + r"\s*%", re.M),
}


def parse_llama_perplexity(text: str) -> dict:
    """The KL divergence statistics `llama-perplexity --kl-divergence` prints, under our keys;
    ValueError naming the first line it could not find (an older or failed run)."""
    out = {}
    for key, pat in _PATTERNS.items():
        m = pat.search(text)
        if m is None:
            raise ValueError(f"llama-perplexity output has no {key.replace('_', ' ')} line (did the run fail?)")
        out[key] = float(m.group(1))
        if key == "mean_kld":
            out["mean_kld_err"] = float(m.group(2))
        elif key == "same_top_pct":
            out["same_top_err_pct"] = float(m.group(2))
    # positions scored: each chunk's second half less its last token (chunks: the per-chunk table's rows)
    ctx = re.search(r"^llama_(?:init_from_model|new_context_with_model): n_ctx\s*=\s*(\d+)", text, re.M)
    rows = re.findall(r"^\s*(\d+)\s+[0-9.]+ ± [0-9.]+\s+-?[0-9.]+ ±", text, re.M)
    if ctx and rows:
        n_ctx = int(ctx.group(1))
        out["positions"] = int(rows[-1]) * (n_ctx - n_ctx // 2 - 1)
    return out
