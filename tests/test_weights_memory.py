"""The IR's weights read into huge-page anonymous memory (mla_export/runtime/weights_memory.py):
byte for byte the file, shared with the compiled model (the model runs from it, and its
logits equal those of OpenVINO's own file mapping, f32), a short file reported by name."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from mla_export.runtime import LLMEngine, SamplingParams
from mla_export.runtime.weights_memory import read_ir, read_weights


def test_read_weights_is_the_file(tmp_path, rng):
    data = rng.integers(0, 256, (3 << 20) + 17, dtype=np.uint8).tobytes()  # not a page multiple
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    buf, size = read_weights(path)
    assert size == len(data) and isinstance(buf, mmap.mmap)
    assert buf[:size] == data
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert read_weights(empty)[1] == 0


def test_short_read_is_reported(tmp_path, monkeypatch):
    path = tmp_path / "w.bin"
    path.write_bytes(b"\1" * 4096)
    # The file shrinks between stat() and the reads (another process rewriting the export).
    real_stat = type(path).stat
    monkeypatch.setattr(type(path), "stat", lambda self, **kw: type("S", (), {"st_size": 8192})()
                        if self == path else real_stat(self, **kw))
    with pytest.raises(OSError, match=r"w\.bin: the file ended at byte 4096 of 8192"):
        read_weights(path)


def _greedy(out_dir, prompts):
    """Greedy tokens of each prompt, and the logits of every step (the executor's output, copied)."""
    eng = LLMEngine(out_dir, precision="f32", num_threads=1, block_order_seed=0)
    logits = []
    run = eng.executor.run
    eng.executor.run = lambda: logits.append(np.array(run(), copy=True)) or logits[-1]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    tokens = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                tokens[o.request_id] = o.token_ids
    return eng, tokens, logits


def test_engine_runs_from_the_buffer_as_from_the_file_mapping(exports, monkeypatch, rng):
    """f32: the same logits, bit for bit, whether the weights are OpenVINO's file mapping or ours."""
    _, out_dir = exports.model("deepseek_v3", "f32", 4)
    prompts = [[int(t) for t in rng.integers(1, 200, n)] for n in (5, 11, 3)]
    monkeypatch.setenv("MLA_EXPORT_WEIGHTS_MMAP", "1")
    mapped_eng, mapped_tokens, mapped_logits = _greedy(out_dir, prompts)
    assert mapped_eng.executor._weights_memory is None
    monkeypatch.delenv("MLA_EXPORT_WEIGHTS_MMAP")
    eng, tokens, logits = _greedy(out_dir, prompts)
    buf = eng.executor._weights_memory
    assert isinstance(buf, mmap.mmap) and len(buf) == (out_dir / "openvino_model.bin").stat().st_size
    assert tokens == mapped_tokens
    assert len(logits) == len(mapped_logits) > 1
    for ours, theirs in zip(logits, mapped_logits):
        np.testing.assert_array_equal(ours, theirs)


def test_read_ir_without_weights_file(exports, tmp_path):
    """No weights file where one was looked for: OpenVINO reads the IR itself (no buffer)."""
    import mla_export

    _, out_dir = exports.model("deepseek_v3", "f32", 4)
    xml = out_dir / "openvino_model.xml"
    model, buf = read_ir(mla_export.ov_core(), xml, tmp_path / "absent.bin")
    assert buf is None and model is not None
