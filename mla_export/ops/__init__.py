"""The mla_export ops as declared once, in table.json next to this file: each op's name, inputs
(name, type class, rank, optional / variadic), attributes (name, type, default, allowed values,
bounds) and outputs (type and shape rule). The native libraries compile the same file into their
adapters (custom_ops/op_table); `library_table()` reads back what a built library holds, so a
stale build is caught by comparing it with `table()` (tests/test_op_table.py).

Python builds from it what it used to restate: the ONNX schemas (onnx_ops.py), node inputs in
their order, attribute checks, and the numpy fronts' one-op models (kernels_openvino.py,
kernels_onnxruntime.py). docs/OPS.md describes the fields.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
from pathlib import Path

__all__ = ["TABLE_PATH", "table", "names", "op", "input_names", "ordered_inputs", "attributes", "output_rank",
           "with_attribute", "comparable", "library_table", "RETIRED"]

TABLE_PATH = Path(__file__).resolve().parent / "table.json"

# Ops the libraries once had and no longer run, with what replaces them (an export holding one
# is refused by name: mla_export/formats/contract.py).
RETIRED = {"MlaPagedDecode": "MlaPagedAttention's decode form (one new token per sequence)"}


@functools.lru_cache(maxsize=1)
def table() -> dict:
    """table.json as loaded (read once)."""
    with open(TABLE_PATH) as f:
        return json.load(f)


def names() -> list[str]:
    return [o["name"] for o in table()["ops"]]


def op(name: str) -> dict:
    for o in table()["ops"]:
        if o["name"] == name:
            return o
    if name in RETIRED:
        raise ValueError(f"op {name!r} was retired: use {RETIRED[name]}")
    raise ValueError(f"no op {name!r} in the mla_export op table (ops: {', '.join(names())})")


def input_names(name: str) -> list[str]:
    return [i["name"] for i in op(name)["inputs"]]


def ordered_inputs(name: str, given: dict, filler=None) -> list:
    """The given inputs in the op's order: every required one, then the optional ones up to the
    last one given; an optional input left out before a given one gets `filler(name)` (the
    ordering input `after`, which is never read). A name the op does not have is refused."""
    spec = op(name)["inputs"]
    known = {i["name"] for i in spec}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"{name} has no input {unknown[0]!r} (inputs: {', '.join(i['name'] for i in spec)})")
    last = max((k for k, i in enumerate(spec) if given.get(i["name"]) is not None), default=-1)
    out = []
    for k, i in enumerate(spec[:last + 1]):
        value = given.get(i["name"])
        if value is None:
            if not i.get("optional"):
                raise ValueError(f"{name}: input '{i['name']}' is required")
            if filler is None:
                raise ValueError(f"{name}: input '{i['name']}' must be given before '{spec[last]['name']}'")
            value = filler(i["name"])
        out.append((i["name"], value))
    return out


def _check_attribute(name: str, a: dict, value):
    kind = a["type"]
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ValueError(f"{name}: attribute '{a['name']}' must be a finite number, got {value!r}")
        return float(value)
    if kind == "int":
        # numpy integers pass through int(); a float would be truncated silently by OpenVINO
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise ValueError(f"{name}: attribute '{a['name']}' must be an integer, got {value!r}")
        value = int(value)
        if "min" in a and value < a["min"]:
            raise ValueError(f"{name}: attribute '{a['name']}' must be >= {a['min']}, got {value}")
    elif not isinstance(value, str):
        raise ValueError(f"{name}: attribute '{a['name']}' must be a string, got {value!r}")
    if "allowed" in a and value not in a["allowed"]:
        raise ValueError(f"{name}: attribute '{a['name']}' must be one of {a['allowed']}, got {value!r}")
    return value


def attributes(name: str, values: dict, *, keep_defaults: bool = True, check: bool = True,
               require: bool = True) -> dict:
    """values by the table, None ones left out: names the op does not have are refused, and
    (with require) a required one missing; with check, types, allowed values and bounds are
    checked here (the libraries check them again; the kernels own the kv_dtype and weight-bits
    rules). check=False, require=False pass values as they are, for tests of the libraries' own
    checks. keep_defaults=False leaves out a value equal to its default."""
    spec = {a["name"]: a for a in op(name)["attributes"]}
    unknown = sorted(set(values) - set(spec))
    if unknown:
        raise ValueError(f"{name} has no attribute {unknown[0]!r} (attributes: {', '.join(spec)})")
    out = {}
    for n, a in spec.items():
        if values.get(n) is None:
            if require and "default" not in a:
                raise ValueError(f"{name}: attribute '{n}' is required")
            continue
        v = _check_attribute(name, a, values[n]) if check else values[n]
        if keep_defaults or v != a.get("default"):
            out[n] = v
    return out


def output_rank(name: str, k: int = 0) -> int | None:
    """The rank of output k by the shape rule (None when it follows an input's rank)."""
    shape = op(name)["outputs"][k]["shape"]
    return None if any(isinstance(t, str) and t.endswith("[:-1]") for t in shape) else len(shape)


def with_attribute(attr: str) -> list[str]:
    """The ops that have this attribute (e.g. the runtime sets `compute` on each of them)."""
    return [o["name"] for o in table()["ops"] if any(a["name"] == attr for a in o["attributes"])]


def comparable(t: dict) -> dict:
    """A table without its docs and with every flag explicit: what the libraries compile in."""
    def inp(i):
        return {"name": i["name"], "type": i["type"], "rank": i.get("rank"), "optional": bool(i.get("optional")),
                "variadic": bool(i.get("variadic")), "exact_i64": bool(i.get("exact_i64"))}

    def attr(a):
        return {k: a[k] for k in ("name", "type", "default", "allowed", "min", "check") if k in a}

    return {"domain": t["domain"], "opset": t["opset"],
            "ops": [{"name": o["name"], "inputs": [inp(i) for i in o["inputs"]],
                     "attributes": [attr(a) for a in o["attributes"]],
                     "outputs": [{k: x[k] for k in ("name", "type", "shape")} for x in o["outputs"]]}
                    for o in t["ops"]]}


def library_table(path: str) -> dict:
    """The table a built library (libmla_export_ov.so or libmla_export_ort.so) was compiled from.
    The onnxruntime one loads on its own; the OpenVINO one needs openvino's libraries, which
    importing openvino loads."""
    lib = ctypes.CDLL(path)
    try:
        fn = lib.mla_export_op_table
    except AttributeError:
        raise RuntimeError(f"{path} has no op table (mla_export_op_table): it was built before the op table "
                           "existed; rebuild it") from None
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())
