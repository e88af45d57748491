"""End-to-end error of the f16, int8 and fp8 caches against the f32 cache on the tiny test models
(V2-Lite-like, V3-like, Kimi-like; tools/kv_dtype_accuracy.py measures, docs/KV_CACHE.md has the
figures). Exported graphs at f32 inference precision with f32 weights, teacher-forced by the f32
cache's greedy tokens, so the only difference between the runs is the cache's rounding.

The bounds are measured behaviour with margin on this short schedule (4 sequences, 12 decode
steps, ~40 decisive steps per model), not the issue's targets in general: a random-weight MoE
model's routing is discontinuous, so any cache rounding can flip an expert at a near-tie and move
a step's logits by far more than the rounding itself. Over 32 sequences (docs/KV_CACHE.md) int8
flips 0 / 2 / 4 of ~640 decisive greedy tokens and fp8 2 / 10 / 19, all but two of them through
routing (routers pinned to f32's choices: int8 none, fp8 2); f16 none. Here f16 and int8 keep
every decisive token and fp8 95%; f16's 2e-3 is held at the 90th percentile
(tests/test_kv_cache_routing.py holds it on every row where routing agrees)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

_TOOL = Path(__file__).parents[1] / "tools" / "kv_dtype_accuracy.py"
_spec = importlib.util.spec_from_file_location("kv_dtype_accuracy", _TOOL)
acc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acc)


@pytest.fixture(scope="module", params=list(acc.CONFIGS))
def measured(request, tmp_path_factory):
    return request.param, acc.measure(request.param, tmp_path_factory.mktemp(request.param), prompt_len=64,
                                      decode_steps=12, log=lambda *_: None)


def test_cache_formats_against_f32(measured):
    name, m = measured
    assert all(v["finite"] for v in m.values())
    assert m["f32"]["worst_rel_err"] == 0.0  # the same graph and cache: identical
    # f16: 10 mantissa bits, well inside 2e-3 on most steps and several times closer than bf16.
    assert m["f16"]["p90_rel_err"] <= 2e-3, m["f16"]
    assert m["f16"]["median_rel_err"] <= m["bf16"]["median_rel_err"] / 4, (m["f16"], m["bf16"])
    # int8 (7 bits + sign per group of r/4) and fp8 (3 mantissa bits): medians over 32 sequences
    # 4.2e-3 .. 5.3e-3 and 2.5e-2 .. 3.2e-2.
    assert m["int8"]["median_rel_err"] <= 1e-2, m["int8"]
    assert m["fp8"]["median_rel_err"] <= 6e-2, m["fp8"]
    assert m["f16"]["median_rel_err"] < m["bf16"]["median_rel_err"] < m["int8"]["median_rel_err"] \
        < m["fp8"]["median_rel_err"] < m["e5m2"]["median_rel_err"], {k: v["median_rel_err"] for k, v in m.items()}
    # e5m2 (2 mantissa bits): about twice fp8's error.
    assert m["e5m2"]["median_rel_err"] <= 3 * m["fp8"]["median_rel_err"], (m["e5m2"], m["fp8"])
    assert m["fp8"]["agree_decisive"] >= 0.95 * m["fp8"]["decisive"], (name, m["fp8"])
    for kv in ("f16", "int8"):
        assert m[kv]["agree_decisive"] == m[kv]["decisive"], (name, kv, m[kv])
    # Bytes per token (all layers), exactly: the test models have r = 32, dr = 16, 3 layers.
    r_dr = {k: v["bytes_per_token"] for k, v in m.items()}
    layers = r_dr["f32"] // (4 * 48)
    assert r_dr == {"f32": layers * 192, "bf16": layers * 96, "f16": layers * 96,
                    "int8": layers * (32 + 4 * 4 + 2 * 16), "fp8": layers * (32 + 4 + 2 * 16),
                    "e5m2": layers * (32 + 4 + 2 * 16)}, r_dr
