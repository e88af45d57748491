"""The numpy front of the MLA ops, on either runtime: `runtime="openvino"` (one-op models
on OpenVINO's CPU plugin, kernels_openvino.py) or `runtime="onnxruntime"` (one-node sessions
with the mla-export custom-op library, kernels_onnxruntime.py). The same C++ kernels run
underneath; tests and benchmarks call these to compare them with mla_export/ops/reference.py.

Inputs are numpy arrays (bf16 as ml_dtypes.bfloat16); the cache of `cache_write` is updated in
place. kv_dtype (every op): the cache's row format (mla_export/formats/kv_formats.py), by the array's
dtype when None; required for quantised caches (u8 arrays). kv_lora_rank (r) is always the
caller's: nothing here assumes DeepSeek's dimensions. num_threads (every op): the threads the
kernels split their work by (OpenVINO's INFERENCE_NUM_THREADS, onnxruntime's intra-op pool);
None: the runtime's default. No torch needed.
"""

from __future__ import annotations

import importlib

import numpy as np

__all__ = ["RUNTIMES", "available", "cache_write", "decode_form", "paged_decode", "paged_attention", "indexer_topk"]

RUNTIMES = ("openvino", "onnxruntime")
FORMS = ("auto", "absorbed", "expanded")


def _runner(runtime: str):
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    return importlib.import_module(f"{__package__}.kernels_{runtime}")


def available(runtime: str) -> bool:
    """Whether the ops can run on `runtime` here (onnxruntime needs the custom-op library)."""
    if runtime == "openvino":
        return True
    try:
        return _runner(runtime).available()
    except ImportError:  # onnxruntime or onnx not installed
        return False


def cache_write(kv_c, k_pe, kv_cache: np.ndarray, slot_mapping, kv_dtype: str | None = None, *,
                runtime: str = "openvino", num_threads: int | None = None) -> np.ndarray:
    """Write [kv_c[t] | k_pe[t]] into kv_cache at slot_mapping[t] (skipping slots < 0), in place.
    kv_cache [NB, BS, r + dr] float32, bfloat16 or float16, or u8 [NB, BS, row bytes] for
    kv_dtype a quantised format; returns kv_cache."""
    return _runner(runtime).cache_write(kv_c, k_pe, kv_cache, slot_mapping, kv_dtype, num_threads=num_threads)


def decode_form(q, kv_lora_rank: int) -> dict:
    """MlaPagedAttention's inputs for absorbed decode queries q [B, H, r + dr] (one new token per
    sequence): q_nope = q[..., :r], q_pe = q[..., r:], w_uk = w_uv = I_r per head, query_start_loc
    = 0..B. In the absorbed form that is vLLM's mla_decode_kvcache: scores of [q_nope | q_pe]
    against the latent rows, output the latent rows' weighted sum [B, H, r] (the identities
    change no value)."""
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, (int, np.integer)):
        raise ValueError(f"kv_lora_rank must be an integer (the model's r), got {kv_lora_rank!r}")
    q = np.asarray(q)
    if q.ndim != 3:
        raise ValueError(f"input 'q' must be [B, H, r + dr], got shape {list(q.shape)}")
    r = int(kv_lora_rank)
    if not 0 < r < q.shape[2]:
        raise ValueError(f"kv_lora_rank must be in [1, {q.shape[2] - 1}] (below q's row width {q.shape[2]}), got {r}")
    eye = np.tile(np.eye(r, dtype=q.dtype), (q.shape[1], 1, 1))
    return dict(q_nope=q[:, :, :r], q_pe=q[:, :, r:], w_uk=eye, w_uv=eye,
                query_start_loc=np.arange(q.shape[0] + 1, dtype=np.int32))


def paged_decode(q, kv_cache, block_tables, seq_lens, scale: float, kv_lora_rank: int,
                 kv_dtype: str | None = None, *, runtime: str = "openvino", num_threads: int | None = None,
                 compute: str = "f32") -> np.ndarray:
    """Absorbed MQA decode: q [B, H, r + dr] -> [B, H, r] (vLLM mla_decode_kvcache semantics), run
    as MlaPagedAttention's decode form (decode_form) in its absorbed form."""
    if kv_lora_rank is None:
        raise ValueError("kv_lora_rank is required (the model's r: the cache row width does not give it)")
    return paged_attention(**decode_form(q, kv_lora_rank), kv_cache=kv_cache, seq_lens=seq_lens,
                           block_tables=block_tables, scale=scale, form="absorbed", kv_dtype=kv_dtype,
                           runtime=runtime, num_threads=num_threads, compute=compute)


def paged_attention(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables,
                    scale: float, form: str = "auto", kv_dtype: str | None = None, *,
                    runtime: str = "openvino", num_threads: int | None = None, compute: str = "f32",
                    topk_indices=None) -> np.ndarray:
    """Causal paged MLA over packed new tokens: -> [T, H, dv]. topk_indices [T, K] (int32/int64):
    sparse attention, each token attends only to the positions it lists (-1 = none; distinct,
    causal, at least one), as DeepSeek Sparse Attention's indexer selects them.
    form: "auto" (per sequence by cost), "absorbed" or "expanded". compute: "f32" (every product
    f32, the exact path) or "bf16" (what the runtime sets under a bf16 hint: single-token rows
    multiply in bf16 with f32 sums on AMX tiles where the CPU has them, else in AVX512-BF16 dot
    products where it has those)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
    if compute not in ("f32", "bf16"):
        raise ValueError(f"compute must be 'f32' or 'bf16', got {compute!r}")
    return _runner(runtime).paged_attention(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens,
                                            block_tables, scale, form, kv_dtype, num_threads=num_threads,
                                            compute=compute, topk_indices=topk_indices)


def indexer_topk(q, weights, index_cache, query_start_loc, seq_lens, block_tables, topk: int,
                 kv_dtype: str | None = None, *, runtime: str = "openvino", num_threads: int | None = None,
                 compute: str = "f32") -> np.ndarray:
    """DeepSeek Sparse Attention's lightning indexer over a paged key cache: q [T, Hi, D] (RoPE
    applied), weights [T, Hi] (every positive factor folded in), index_cache [NB, BS, D] (u8 rows
    for quantised formats) -> [T, topk] int32: per new token the topk positions it sees of largest
    sum_h weights[t, h] * relu(q[t, h] . key[s]), ascending, -1 padded when it sees fewer.
    compute: "f32" (exact) or "bf16" (the runtime's bf16 hint: bf16 products with f32 sums on AMX
    tiles where the CPU has them)."""
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise ValueError(f"topk must be a positive integer, got {topk!r}")
    if compute not in ("f32", "bf16"):
        raise ValueError(f"compute must be 'f32' or 'bf16', got {compute!r}")
    return _runner(runtime).indexer_topk(q, weights, index_cache, query_start_loc, seq_lens, block_tables, int(topk),
                                         kv_dtype, num_threads=num_threads, compute=compute)
