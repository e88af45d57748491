"""Building ONNX graphs node by node, with weights streamed to an external data file.

`WeightStore` appends each initializer's bytes to one file as soon as it is made and keeps only
a TensorProto that points there (offset, length), so the model proto never holds weight data and
the exporter's memory stays near one layer's tensors. `WeightFormat` says how each weight is stored:
float formats (f32/f16/bf16) store it in that dtype followed by a Cast to f32 (OpenVINO keeps such
Const -> Convert pairs as compressed weights); int8/int4 store codes, zero points and scales
(quantize.py) followed by the Cast/Sub/Mul(/Reshape) chain that OpenVINO's CPU plugin recognises
and decompresses on the fly inside FullyConnected and Gather. Norms, biases, the router and the
RoPE tables stay f32 (transformers keeps the router f32 too).

`GraphBuilder` emits nodes into one or more *variants* at once: the custom-op graph and the
portable graph share every node except the MLA ones, so both are built in one pass over the
weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .quantize import CODE_FORMATS, FLOAT_FORMATS, FP8_BITS, Quantized, dequantize, pack_u4, pick_group, quantize

__all__ = ["WeightStore", "GraphBuilder", "WeightFormat", "WEIGHT_DTYPES"]

WEIGHT_DTYPES = {"f32": (np.float32, TensorProto.FLOAT), "f16": (np.float16, TensorProto.FLOAT16),
                 "bf16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16)}
_INLINE_BYTES = 1024  # smaller tensors stay inside the .onnx file
_ALIGN = 64


@dataclass
class WeightFormat:
    """How matmul and embedding weights are stored.

    fmt: f32 | f16 | bf16 | int8 | int4 | fp8. float_dtype: the dtype of weights that stay float (all of
    them for float formats; the attention op's absorbed w_uk/w_uv, which feed a custom op rather
    than a MatMul, for int formats). group_size: int4 inputs per scale (-1 = per output channel).
    int4 keeps the embedding table and lm_head in int8 (NNCF's default: they are the most
    sensitive and a small share of the weights) unless all_layers (optimum-cli's --all-layers):
    then they are int4 too."""

    fmt: str = "f32"
    float_dtype: str = "f32"
    group_size: int = 128
    ratio: float = 1.0  # int4: share of the matmul weights (by parameters) in int4, the rest int8
    all_layers: bool = False  # int4: the embedding table and lm_head in int4 as well
    int8_names: frozenset = frozenset()  # int4 with ratio < 1: matmul weights planned into int8
    overrides: tuple = ()  # int4: --tensor-format rules (tensor_formats.TensorFormat), first match decides
    matched: dict = field(default_factory=dict)  # rule text -> stored weight names it decided (shared by copies)
    planning: bool = False  # a planning pass: record int4 sensitivities, store nothing
    sensitivity: dict = field(default_factory=dict)  # name -> (int4 relative error, parameters)
    stats: dict = field(default_factory=dict)  # what was stored: format -> parameter count, group sizes used

    def __post_init__(self):
        if self.fmt not in FLOAT_FORMATS + CODE_FORMATS:
            raise ValueError(f"weight format must be f32, f16, bf16, int8, int4 or fp8, got {self.fmt!r}")
        if self.float_dtype not in FLOAT_FORMATS:
            raise ValueError(f"float weight dtype must be f32, f16 or bf16, got {self.float_dtype!r}")
        if self.fmt in FLOAT_FORMATS:
            self.float_dtype = self.fmt

    def bits(self, kind: str, name: str = "", sources: tuple[str, ...] | None = None) -> int | None:
        """Code bits for the weight `name` of this kind (matmul | embedding | head), None to keep it
        float: 4 / 8 integer codes, FP8_BITS e4m3 codes (fp8: the matmul weights our ops read; the
        embedding table and lm_head int8, as int4 keeps them; a matmul weight our ops cannot take
        stays float, GraphBuilder.weight). int4: a --tensor-format rule matching the checkpoint
        tensors `sources` the weight is made of (default: `name` itself) decides first; a weight
        whose format is not the int4 default rule's is recorded in stats["formats"] (the contract's
        record of which weights ended in which format, read by bench/bytes_per_token.py)."""
        if self.fmt == "int8":
            return 8
        if self.fmt == "fp8":
            return FP8_BITS if kind == "matmul" else 8
        if self.fmt != "int4":
            return None
        default = 8 if kind in ("embedding", "head") and not self.all_layers else 4
        bits = 8 if name in self.int8_names else default  # --ratio's plan may move any of them to int8
        for rule in self.overrides:
            if name and rule.choose(name, tuple(sources) if sources else (name,)):
                self.matched.setdefault(rule.text, set()).add(name)
                bits = rule.bits
                break
        if bits != default:
            self.stats.setdefault("formats", {})[name] = f"int{bits}"
        return bits

    def plan(self) -> None:
        """After a planning pass: the most int4-sensitive matmul weights go to int8 until they hold
        (1 - ratio) of the matmul parameters (NNCF's data-free mixed precision, by the weights' own
        int4 quantization error)."""
        total = sum(n for _, n in self.sensitivity.values())
        budget, chosen = (1.0 - self.ratio) * total, set()
        for name, (_, n) in sorted(self.sensitivity.items(), key=lambda kv: -kv[1][0]):
            if budget <= 0:
                break
            chosen.add(name)
            budget -= n
        self.int8_names, self.planning, self.stats = frozenset(chosen), False, {}

    def record(self, what: str, params: int, group: int | None = None) -> None:
        self.stats.setdefault("params", {})
        self.stats["params"][what] = self.stats["params"].get(what, 0) + params
        if group is not None:
            self.stats.setdefault("int4_group_sizes", [])
            if group not in self.stats["int4_group_sizes"]:
                self.stats["int4_group_sizes"].append(group)


def _int4_error(w: np.ndarray, group_size: int, rows: int = 512) -> float:
    """Relative Frobenius error of int4 quantization on an even sample of the weight's rows."""
    flat = w.reshape(-1, w.shape[-1])
    sample = flat[np.linspace(0, len(flat) - 1, min(rows, len(flat))).astype(np.int64)]
    back = dequantize(quantize(sample, 4, pick_group(w.shape[-1], group_size)))
    return float(np.linalg.norm(back - sample) / max(np.linalg.norm(sample), 1e-30))


class WeightStore:
    def __init__(self, data_path: Path, weight_format: WeightFormat | str):
        if isinstance(weight_format, str):
            weight_format = WeightFormat(weight_format)
        self.data_path = Path(data_path)
        self.format = weight_format
        self.weight_dtype = weight_format.float_dtype
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
            array = np.asarray(array, order="C")  # keeps rank 0 (ascontiguousarray would make it [1])
        if array.nbytes <= _INLINE_BYTES and onnx_type != TensorProto.BFLOAT16:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        raw = array.view(np.uint16).tobytes() if onnx_type == TensorProto.BFLOAT16 else array.tobytes()
        return self.add_raw(name, onnx_type, array.shape, raw)

    def add_u4(self, name: str, codes: np.ndarray) -> str:
        """Codes 0..15 stored as ONNX UINT4 (two per byte)."""
        return self.add_raw(name, TensorProto.UINT4, codes.shape, pack_u4(codes))

    def add_raw(self, name: str, onnx_type: int, shape, raw: bytes) -> str:
        """An initializer from its raw little-endian bytes: inline when small, else appended to the data file."""
        if len(raw) > _INLINE_BYTES:
            return self.add_chunks(name, onnx_type, shape, [raw])
        self.initializers.append(helper.make_tensor(name, onnx_type, list(shape), raw, raw=True))
        return name

    def add_chunks(self, name: str, onnx_type: int, shape, chunks) -> str:
        """An initializer appended to the data file chunk by chunk (an iterable of bytes), so a
        tensor larger than memory (one projection of every expert of a layer) is never whole."""
        pad = (-self._file.tell()) % _ALIGN
        self._file.write(b"\0" * pad)
        offset = self._file.tell()
        for chunk in chunks:
            self._file.write(chunk)
        length = self._file.tell() - offset
        self.bytes_written = self._file.tell()
        t = TensorProto(name=name, data_type=onnx_type, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
        self.initializers.append(t)
        return name

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class GraphBuilder:
    """Nodes for several graph variants at once; `op` emits into all, `add_node` into one,
    `only(...)` gives a view for a subset."""

    def __init__(self, store: WeightStore, variants: list[str]):
        self.store = store
        self.variants = {v: [] for v in variants}
        self._count = [0]  # shared with the views `only` makes, so node names stay unique
        self._consts: dict = {}

    def only(self, variants) -> "GraphBuilder":
        """A view that emits into the named variants only (same weights file, constants, names)."""
        view = GraphBuilder.__new__(GraphBuilder)
        view.store, view._count, view._consts = self.store, self._count, self._consts
        view.variants = {v: self.variants[v] for v in variants}
        return view

    def _name(self, base: str) -> str:
        self._count[0] += 1
        return f"{base}_{self._count[0]}"

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

    def i64_scalar(self, value: int) -> str:
        """A rank-0 int64 constant (a Gather index that drops the axis)."""
        key = ("i64_scalar", int(value))
        if key not in self._consts:
            self._consts[key] = self.store.add(self._name("const_i64"), np.array(value, dtype=np.int64))
        return self._consts[key]

    def f32(self, value: float) -> str:
        key = ("f32", float(value))
        if key not in self._consts:
            self._consts[key] = self.store.add(self._name("const_f32"), np.array(value, dtype=np.float32))
        return self._consts[key]

    # weights
    def weight(self, name: str, array: np.ndarray, kind: str = "matmul", record: bool = True,
               sources: tuple[str, ...] | None = None) -> str:
        """A weight [..., out, in] (input axis last) in the export's weight format, as an f32 value.

        kind: matmul (a Gemm/MatMul operand), embedding (a Gather table), head (lm_head), or
        float (always kept float: operands of the custom attention op). record: count it in the
        export's stats (False when another variant's node on the same weight already counts it).
        sources: the checkpoint tensors the weight is made of (WeightFormat.bits), default `name`."""
        fmt = self.store.format
        bits = None if kind == "float" else fmt.bits(kind, name, sources)
        if fmt.planning:
            if bits == 4:
                fmt.sensitivity[name] = (_int4_error(array, fmt.group_size), array.size)
            return name  # the planning graph is never saved
        if bits is None or bits == FP8_BITS:  # fp8 codes are read by our ops only: float elsewhere
            if record:
                fmt.record(fmt.float_dtype, array.size)
            stored = self.store.add(name, array, fmt.float_dtype)
            if fmt.float_dtype == "f32":
                return stored
            return self.op("Cast", stored, name=f"{name}.to_f32", to=TensorProto.FLOAT)
        group = pick_group(array.shape[-1], fmt.group_size) if bits == 4 else None
        qw = quantize(array, bits, group)
        if record:
            fmt.record(f"int{bits}", array.size, group if bits == 4 else None)
        return self._dequantized(name, qw)

    def attention_weight(self, name: str, array: np.ndarray, ours: list[str]) -> tuple[str, str | None]:
        """An operand of the attention op, kept float in every format: (the value the variants
        `ours` (our op) read, the f32 value the other variants' standard ops read, None if there
        are none). Our op reads bf16 as stored: its absorbed products widen it in registers, at
        half the bytes of the f32 copy the plugin folds a Cast into. f16/f32: the f32 value."""
        fmt = self.store.format
        rest = [v for v in self.variants if v not in ours]
        if fmt.float_dtype != "bf16" or fmt.planning:
            f32 = self.weight(name, array, kind="float")
            return f32, (f32 if rest else None)
        fmt.record("bf16", array.size)
        stored = self.store.add(name, array, "bf16")
        if not rest:
            return stored, None
        return stored, self.only(rest).op("Cast", stored, name=f"{name}.to_f32", to=TensorProto.FLOAT)

    def _dequantized(self, name: str, qw: Quantized) -> str:
        """Stored codes/zero points/scales and the decompression chain, (q - zp) * s -> f32 [..., out, in]."""
        if qw.bits == 8:  # one group per row: drop the group axis, as the plugin's per-channel form has it
            lead = qw.q.shape[:-2]
            q = self.store.add(f"{name}.q", qw.q.reshape(lead + (qw.q.shape[-1],)))
            zp = self.store.add(f"{name}.zp", qw.zp.reshape(lead + (1,)))
            scale = self.store.add(f"{name}.scale", qw.scale.reshape(lead + (1,)), "f16")
        else:
            q = self.store.add_u4(f"{name}.q", qw.q)
            zp = self.store.add_u4(f"{name}.zp", qw.zp)
            scale = self.store.add(f"{name}.scale", qw.scale, "f16")
        f32 = TensorProto.FLOAT
        diff = self.op("Sub", self.op("Cast", q, to=f32), self.op("Cast", zp, to=f32), name=f"{name}.centered")
        w = self.op("Mul", diff, self.op("Cast", scale, to=f32), name=f"{name}.dequantized")
        if qw.bits == 4:
            w = self.op("Reshape", w, self.i64(*qw.shape), name=f"{name}.ungrouped")
        return w

    def f32_tensor(self, name: str, array: np.ndarray) -> str:
        """A tensor kept in f32 whatever the weight dtype (norms, biases, router, tables)."""
        return self.store.add(name, array.astype(np.float32), "f32")
