"""The backend's cache layout facts, executor choice and block copies (the backend on a real
export is exercised by every engine test)."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime.backend import copy_blocks, executor_class, get_kv_cache_shape


def test_cache_shape_and_executor_classes():
    assert get_kv_cache_shape(10, 16, 1, 576) == (10, 16, 576)
    with pytest.raises(ValueError, match="one KV head"):
        get_kv_cache_shape(10, 16, 2, 576)
    assert executor_class("openvino").__name__ == "OpenVINOMLAExecutor"
    assert executor_class("onnxruntime").__name__ == "OnnxRuntimeMLAExecutor"
    with pytest.raises(ValueError, match="runtime must be one of"):
        executor_class("tensorrt")


def test_copy_blocks_in_every_layer_in_order(rng):
    layers = [rng.standard_normal((5, 2, 3)).astype(np.float32) for _ in range(3)]
    before = [c.copy() for c in layers]
    # Block 1 is first copied to 4, then overwritten by block 0 (the order a block freed by one
    # copy-on-write and handed to the next one as its destination produces).
    copy_blocks(layers, np.array([[1, 4], [0, 1]]))
    for cache, old in zip(layers, before):
        np.testing.assert_array_equal(cache[4], old[1])
        np.testing.assert_array_equal(cache[1], old[0])
        np.testing.assert_array_equal(cache[[0, 2, 3]], old[[0, 2, 3]])
    with pytest.raises(ValueError, match="block ids"):
        copy_blocks(layers, [[0, 5]])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        copy_blocks(layers, [0, 1])
    copy_blocks(layers, [])  # no copies: nothing happens
