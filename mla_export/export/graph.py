"""Building ONNX graphs node by node, with weights streamed to an external data file.

`WeightStore` appends each initializer's bytes to one file as soon as it is made and keeps only
a TensorProto that points there (offset, length), so the model proto never holds weight data and
the exporter's memory stays near one layer's tensors. Weights are stored in the export's weight
dtype and followed by a Cast to f32 (OpenVINO keeps such Const -> Convert pairs as compressed
weights); norms, biases, the router and the RoPE tables stay f32 (transformers keeps the router
f32 too).

`GraphBuilder` emits nodes into one or more *variants* at once: the custom-op graph and the
portable graph share every node except the MLA ones, so both are built in one pass over the
weights.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper, numpy_helper

__all__ = ["WeightStore", "GraphBuilder", "WEIGHT_DTYPES"]

WEIGHT_DTYPES = {"f32": (np.float32, TensorProto.FLOAT), "f16": (np.float16, TensorProto.FLOAT16),
                 "bf16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16)}
_INLINE_BYTES = 1024  # smaller tensors stay inside the .onnx file
_ALIGN = 64


class WeightStore:
    def __init__(self, data_path: Path, weight_dtype: str):
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_DTYPES)}, got {weight_dtype!r}")
        self.data_path = Path(data_path)
        self.weight_dtype = weight_dtype
        self.initializers: list[TensorProto] = []
        self._file = open(self.data_path, "wb")
        self.bytes_written = 0

    def add(self, name: str, array: np.ndarray, dtype: str = "f32") -> str:
        """Store `array` (converted to dtype f32/f16/bf16, or kept as an integer array) as `name`."""
        if array.dtype.kind == "f":
            np_type, onnx_type = WEIGHT_DTYPES[dtype]
            array = np.ascontiguousarray(array.astype(np_type))
        else:
            onnx_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            array = np.ascontiguousarray(array)
        if array.nbytes <= _INLINE_BYTES:
            if onnx_type == TensorProto.BFLOAT16:
                t = helper.make_tensor(name, onnx_type, array.shape, array.view(np.uint16).tobytes(), raw=True)
            else:
                t = numpy_helper.from_array(array, name)
        else:
            t = TensorProto(name=name, data_type=onnx_type, dims=list(array.shape))
            pad = (-self._file.tell()) % _ALIGN
            self._file.write(b"\0" * pad)
            offset = self._file.tell()
            self._file.write(array.tobytes())
            self.bytes_written = self._file.tell()
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", self.data_path.name), ("offset", str(offset)),
                               ("length", str(array.nbytes))):
                t.external_data.add(key=key, value=value)
        self.initializers.append(t)
        return name

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class GraphBuilder:
    """Nodes for several graph variants at once; `op` emits into all, `op_in` into one."""

    def __init__(self, store: WeightStore, variants: list[str]):
        self.store = store
        self.variants = {v: [] for v in variants}
        self._count = 0
        self._consts: dict = {}

    def _name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def _make(self, op_type: str, inputs, n_out: int, domain: str, name: str | None, attrs: dict):
        name = name or self._name(op_type)
        outs = [f"{name}.out{i}" if n_out > 1 else name for i in range(n_out)]
        node = helper.make_node(op_type, list(inputs), outs, name=name, domain=domain or None, **attrs)
        return node, (outs[0] if n_out == 1 else outs)

    def op(self, op_type: str, *inputs: str, n_out: int = 1, domain: str = "", name: str | None = None, **attrs):
        node, outs = self._make(op_type, inputs, n_out, domain, name, attrs)
        for nodes in self.variants.values():
            nodes.append(node)
        return outs

    def add_node(self, variant: str, node) -> None:
        self.variants[variant].append(node)

    # constants (deduplicated)
    def i64(self, *values: int) -> str:
        key = ("i64", values)
        if key not in self._consts:
            self._consts[key] = self.store.add(self._name("const_i64"), np.array(values, dtype=np.int64))
        return self._consts[key]

    def f32(self, value: float) -> str:
        key = ("f32", float(value))
        if key not in self._consts:
            self._consts[key] = self.store.add(self._name("const_f32"), np.array(value, dtype=np.float32))
        return self._consts[key]

    # weights
    def weight(self, name: str, array: np.ndarray) -> str:
        """A matmul/embedding weight in the export's weight dtype, as an f32 value."""
        stored = self.store.add(name, array, self.store.weight_dtype)
        if self.store.weight_dtype == "f32":
            return stored
        return self.op("Cast", stored, name=f"{name}.to_f32", to=TensorProto.FLOAT)

    def f32_tensor(self, name: str, array: np.ndarray) -> str:
        """A tensor kept in f32 whatever the weight dtype (norms, biases, router, tables)."""
        return self.store.add(name, array.astype(np.float32), "f32")
