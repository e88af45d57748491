"""The backend class's static facts and block moves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mla_export.runtime import MLAMetadata, MLAMetadataBuilder, OpenVINOMLABackend


def test_names_and_shapes():
    B = OpenVINOMLABackend
    assert B.get_name() == "OPENVINO_MLA"
    assert B.get_supported_head_sizes() == [576]
    assert B.get_supported_head_sizes(48) == [48]
    assert B.get_kv_cache_shape(10, 16, 1, 576) == (10, 16, 576)
    with pytest.raises(ValueError, match="one KV head"):
        B.get_kv_cache_shape(10, 16, 2, 576)
    assert B.get_builder_cls() is MLAMetadataBuilder
    assert B.get_metadata_cls() is MLAMetadata
    assert B.get_impl_cls().__name__ == "OpenVINOMLAExecutor"
    assert B.get_impl_cls("onnxruntime").__name__ == "OnnxRuntimeMLAExecutor"
    with pytest.raises(ValueError, match="runtime must be one of"):
        B.get_impl_cls("tensorrt")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_swap_blocks_between_caches_of_different_sizes(rng, dtype):
    src = rng.standard_normal((6, 4, 8)).astype(dtype)
    dst = np.zeros((3, 4, 8), dtype=dtype)
    before = src.copy()
    OpenVINOMLABackend.swap_blocks(src, dst, np.array([[5, 0], [1, 2]]))
    np.testing.assert_array_equal(dst[0], src[5])
    np.testing.assert_array_equal(dst[2], src[1])
    assert not dst[1].any()
    np.testing.assert_array_equal(src, before)  # the source is only read
    with pytest.raises(ValueError, match="destination"):
        OpenVINOMLABackend.swap_blocks(src, dst, [[0, 3]])
    with pytest.raises(ValueError, match="same block shape"):
        OpenVINOMLABackend.swap_blocks(src, np.zeros((3, 4, 9), dtype=dtype), [[0, 0]])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        OpenVINOMLABackend.swap_blocks(src, dst, [0, 1])


def test_copy_blocks_in_every_layer_reads_all_sources_first(rng):
    layers = [rng.standard_normal((5, 2, 3)).astype(np.float32) for _ in range(3)]
    before = [c.copy() for c in layers]
    # block 1 is both a destination (of 0) and a source (for 4): 4 must get the *old* block 1.
    OpenVINOMLABackend.copy_blocks(layers, np.array([[0, 1], [1, 4]]))
    for cache, old in zip(layers, before):
        np.testing.assert_array_equal(cache[1], old[0])
        np.testing.assert_array_equal(cache[4], old[1])
        np.testing.assert_array_equal(cache[[0, 2, 3]], old[[0, 2, 3]])
    with pytest.raises(ValueError, match="block ids"):
        OpenVINOMLABackend.copy_blocks(layers, [[0, 5]])
