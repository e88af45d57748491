"""The implementations that tools/bench_kernels.py times side by side, on the same inputs.

Every builder takes a case's inputs (numpy arrays) and returns an `Impl`: `times(n)` runs n
timed calls and returns their durations in seconds, `output()` runs once and returns the
result as float32 numpy (outside any timing). Compiled models are built once per signature.

- ours:    the mla_export op MlaPagedAttention as one-op OpenVINO models (decode: its decode form,
           mla_export.ops.kernels.decode_form), called through a pre-bound infer request (no
           per-call tensor creation).
- torch:   plain torch gather + matmul + softmax (f32 math, also for a bf16 cache).
- ov-std:  the same math from standard OpenVINO ops (Gather + MatMul + Softmax), compiled once.
- ort:     the mla_export ops through onnxruntime and libmla_export_ort.so (optional).
- peers:   vLLM / SGLang kernels in their own process (tools/peer_runner.py), see PeerProcess.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from mla_export.ops.ov_tensors import BF16

R, DR, DN, DV = 512, 64, 128, 128  # DeepSeek's kv_lora_rank, rope, nope and value head dims
W = R + DR
DTYPES = {"f32": np.dtype(np.float32), "bf16": BF16}


# ------------------------------------------------------------------ inputs

def _randn(rng, shape, dtype, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(DTYPES[dtype])


def _paged_layout(rng, lengths: list[int], block_size: int):
    """Shuffled block tables (int32 [B, M]) for sequences of the given lengths, and NB."""
    used = [(n + block_size - 1) // block_size for n in lengths]
    nb = sum(used) + 1  # one spare block nobody owns
    perm = rng.permutation(nb).astype(np.int32)
    tables = np.zeros((len(lengths), max(used)), dtype=np.int32)
    cursor = 0
    for b, n in enumerate(used):
        tables[b, :n] = perm[cursor:cursor + n]
        cursor += n
    return tables, nb


def decode_inputs(rng, batch: int, heads: int, ctx: int, block_size: int, dtype: str,
                  lengths: tuple[int, ...] = ()) -> dict:
    """`batch` sequences of `ctx` tokens, or of the given `lengths` (a mixed batch)."""
    lengths = list(lengths) or [ctx] * batch
    tables, nb = _paged_layout(rng, lengths, block_size)
    return {"q": _randn(rng, (len(lengths), heads, W), dtype),
            "kv_cache": _randn(rng, (nb, block_size, W), dtype),
            "block_tables": tables, "seq_lens": np.array(lengths, dtype=np.int32)}


def prefill_inputs(rng, new: int, prefix: int, heads: int, block_size: int, dtype: str) -> dict:
    """One sequence: `prefix` cached tokens + `new` tokens whose rows are already in the cache."""
    tables, nb = _paged_layout(rng, [prefix + new], block_size)
    return {"q_nope": _randn(rng, (new, heads, DN), dtype), "q_pe": _randn(rng, (new, heads, DR), dtype),
            "kv_cache": _randn(rng, (nb, block_size, W), dtype),
            "w_uk": _randn(rng, (heads, DN, R), dtype, DN ** -0.5),
            "w_uv": _randn(rng, (heads, R, DV), dtype, R ** -0.5),
            "query_start_loc": np.array([0, new], dtype=np.int32),
            "seq_lens": np.array([prefix + new], dtype=np.int32), "block_tables": tables}


DECODE_INPUTS = ["q", "kv_cache", "block_tables", "seq_lens"]
PREFILL_INPUTS = ["q_nope", "q_pe", "kv_cache", "w_uk", "w_uv", "query_start_loc", "seq_lens", "block_tables"]


# ------------------------------------------------------------------ the Impl interface

@dataclass
class Impl:
    times: Callable[[int], list[float]]
    output: Callable[[], np.ndarray]


def local_impl(fn: Callable[[], object], to_f32: Callable[[object], np.ndarray]) -> Impl:
    def times(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out
    return Impl(times, lambda: np.asarray(to_f32(fn()), dtype=np.float32))


class Skip(Exception):
    """This implementation does not run this case (the message says why)."""


# ------------------------------------------------------------------ OpenVINO: ours and ov-std

def ov_config(threads: int) -> dict:
    return {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}


def _bound_request(compiled, arrays: list[np.ndarray]) -> Impl:
    """An Impl over an infer request with every input bound once, without copies."""
    from mla_export.ops.ov_tensors import shared_tensor, to_numpy

    req = compiled.create_infer_request()
    keep = [np.ascontiguousarray(a) for a in arrays]
    for i, a in enumerate(keep):
        req.set_input_tensor(i, shared_tensor(a))

    def run():
        _ = keep  # the bound buffers live as long as this closure
        req.infer()
        return req.get_output_tensor(0)
    return local_impl(run, to_numpy)


_compiled: dict = {}


def _compile(key, build, threads: int):
    if key not in _compiled:
        from mla_export import ov_core
        _compiled[key] = ov_core().compile_model(build(), "CPU", ov_config(threads))
    return _compiled[key]


def _ours_model(op: str, inputs: list[tuple[str, np.ndarray]], attrs: dict):
    import openvino as ov

    from mla_export import ov_core
    from mla_export.ops.kernels_openvino import _single_op_ir
    from mla_export.ops.ov_tensors import ov_type

    xml = _single_op_ir(op, [(n, ov_type(a.dtype), a.ndim) for n, a in inputs], attrs,
                        ov_type(inputs[0][1].dtype), 3)
    return ov_core().read_model(model=xml, weights=ov.Tensor(ov.Type.u8, [0]))


def _as_graph_binds(inp: dict, names: list[str]) -> list[tuple[str, np.ndarray]]:
    """The inputs as the exported graphs bind them: a bf16 cache as its raw bytes (the CPU
    plugin would convert a bf16 cache input into an f32 copy on every call on CPUs without
    native bf16; see mla_export/ops/cache_binding.py)."""
    from mla_export.ops.cache_binding import cache_binding
    return [(n, cache_binding(inp[n]) if n == "kv_cache" else inp[n]) for n in names]


def with_kv_dtype(inp: dict, kv_dtype: str) -> dict:
    """The same inputs with the cache's values stored in another row format (f16, int8, fp8:
    mla_export/formats/kv_formats.py), to time the formats side by side on equal data."""
    from mla_export.formats.kv_formats import encode_rows
    cache = inp["kv_cache"]
    rows = encode_rows(cache.reshape(-1, cache.shape[-1]).astype(np.float32), kv_dtype, R)
    return dict(inp, kv_cache=rows.reshape(*cache.shape[:2], -1))


def decode_form_inputs(inp: dict) -> dict:
    """A decode case's inputs (q [B, H, W]) as MlaPagedAttention's decode form, in the op's order."""
    from mla_export import ops
    from mla_export.ops.kernels import decode_form
    given = {**decode_form(inp["q"], R), **{n: inp[n] for n in DECODE_INPUTS[1:]}}
    return {n: np.ascontiguousarray(a) for n, a in ops.ordered_inputs("MlaPagedAttention", given)}


def ours_decode(inp: dict, scale: float, threads: int, kv_dtype: str | None = None, compute: str = "f32") -> Impl:
    """compute "bf16": as the runtime sets it under a bf16 hint (bf16 products, f32 sums)."""
    form = decode_form_inputs(inp)
    named = _as_graph_binds(form, list(form))
    attrs = {"scale": repr(float(scale)), "form": 1, "compute": compute,
             **({"kv_dtype": kv_dtype} if kv_dtype else {})}
    key = ("ours_decode", inp["q"].dtype.str, scale, kv_dtype, compute)
    compiled = _compile(key, lambda: _ours_model("MlaPagedAttention", named, attrs), threads)
    return _bound_request(compiled, [a for _, a in named])


def ours_prefill(inp: dict, scale: float, threads: int, form: str = "auto", kv_dtype: str | None = None,
                 compute: str = "f32") -> Impl:
    named = _as_graph_binds(inp, PREFILL_INPUTS)
    attrs = {"scale": repr(float(scale)), "form": {"auto": 0, "absorbed": 1, "expanded": 2}[form],
             "compute": compute, **({"kv_dtype": kv_dtype} if kv_dtype else {})}
    key = ("ours_prefill", inp["q_nope"].dtype.str, scale, form, kv_dtype, compute)
    compiled = _compile(key, lambda: _ours_model("MlaPagedAttention", named, attrs), threads)
    return _bound_request(compiled, [a for _, a in named])


def _ops():
    import openvino.opset13 as ops
    return ops


def _param(ops, name, dtype, rank, last=None):
    import openvino as ov
    from mla_export.ops.ov_tensors import ov_type
    shape = [-1] * rank if last is None else [-1] * (rank - 1) + [last]
    return ops.parameter(ov.PartialShape(shape), ov_type(dtype), name=name)


def _f32(ops, node):
    import openvino as ov
    return ops.convert(node, ov.Type.f32)


def _i32(ops, values):
    return ops.constant(np.array(values, dtype=np.int32))


def _gather_rows(ops, cache, tables, rank_out: int):
    """cache [NB, BS, W] gathered through tables [B, M] -> [B, M*BS, W] (or [M*BS, W] for rank 2)."""
    rows = ops.gather(cache, tables, _i32(ops, 0))  # [B, M, BS, W]
    shape = [0, -1, W] if rank_out == 3 else [-1, W]
    return ops.reshape(rows, _i32(ops, shape), special_zero=True)


def _slice_last(ops, node, start: int, stop: int):
    return ops.slice(node, _i32(ops, [start]), _i32(ops, [stop]), _i32(ops, [1]), _i32(ops, [-1]))


def _ovstd_decode_model(dtype, scale: float):
    import openvino as ov
    ops = _ops()
    q, cache = _param(ops, "q", dtype, 3, W), _param(ops, "kv_cache", dtype, 3, W)
    tables, lens = _param(ops, "block_tables", np.int32, 2), _param(ops, "seq_lens", np.int32, 1)
    rows = _gather_rows(ops, _f32(ops, cache), tables, 3)  # [B, L', W]
    s = ops.multiply(ops.matmul(_f32(ops, q), rows, False, True), ops.constant(np.float32(scale)))  # [B, H, L']
    length = ops.gather(ops.shape_of(rows, "i32"), _i32(ops, 1), _i32(ops, 0))
    pos = ops.range(_i32(ops, 0), length, _i32(ops, 1), "i32")  # [L']
    valid = ops.less(ops.unsqueeze(pos, _i32(ops, 0)), ops.unsqueeze(lens, _i32(ops, 1)))  # [B, L']
    s = ops.select(ops.unsqueeze(valid, _i32(ops, 1)), s, ops.constant(np.float32(-np.inf)))
    out = ops.matmul(ops.softmax(s, -1), _slice_last(ops, rows, 0, R), False, False)  # [B, H, R]
    out = ops.convert(out, q.get_element_type())
    return ov.Model([out], [q, cache, tables, lens], "ovstd_decode")


def _ovstd_prefill_model(dtype, scale: float):
    """Expanded form (the cheaper one for long new-token runs), one sequence."""
    import openvino as ov
    ops = _ops()
    q_nope, q_pe = _param(ops, "q_nope", dtype, 3, DN), _param(ops, "q_pe", dtype, 3, DR)
    cache = _param(ops, "kv_cache", dtype, 3, W)
    w_uk, w_uv = _param(ops, "w_uk", dtype, 3, R), _param(ops, "w_uv", dtype, 3, DV)
    qsl, lens = _param(ops, "query_start_loc", np.int32, 1), _param(ops, "seq_lens", np.int32, 1)
    tables = _param(ops, "block_tables", np.int32, 2)
    rows = ops.unsqueeze(_gather_rows(ops, _f32(ops, cache), tables, 2), _i32(ops, 0))  # [1, L', W]
    kv_c, k_pe = _slice_last(ops, rows, 0, R), _slice_last(ops, rows, R, W)
    k_nope = ops.matmul(kv_c, _f32(ops, w_uk), False, True)  # [H, L', DN]
    v = ops.matmul(kv_c, _f32(ops, w_uv), False, False)  # [H, L', DV]
    qn = ops.transpose(_f32(ops, q_nope), _i32(ops, [1, 0, 2]))  # [H, T, DN]
    qp = ops.transpose(_f32(ops, q_pe), _i32(ops, [1, 0, 2]))  # [H, T, DR]
    s = ops.add(ops.matmul(qn, k_nope, False, True), ops.matmul(qp, k_pe, False, True))  # [H, T, L']
    s = ops.multiply(s, ops.constant(np.float32(scale)))
    t = ops.gather(ops.shape_of(q_nope, "i32"), _i32(ops, 0), _i32(ops, 0))
    length = ops.gather(ops.shape_of(rows, "i32"), _i32(ops, 1), _i32(ops, 0))
    first = ops.subtract(ops.gather(lens, _i32(ops, 0), _i32(ops, 0)), t)  # position of new token 0
    qpos = ops.add(ops.range(_i32(ops, 0), t, _i32(ops, 1), "i32"), first)  # [T]
    kpos = ops.range(_i32(ops, 0), length, _i32(ops, 1), "i32")  # [L']
    causal = ops.less_equal(ops.unsqueeze(kpos, _i32(ops, 0)), ops.unsqueeze(qpos, _i32(ops, 1)))  # [T, L']
    s = ops.select(causal, s, ops.constant(np.float32(-np.inf)))
    out = ops.transpose(ops.matmul(ops.softmax(s, -1), v, False, False), _i32(ops, [1, 0, 2]))  # [T, H, DV]
    out = ops.convert(out, q_nope.get_element_type())
    return ov.Model([out], [q_nope, q_pe, cache, w_uk, w_uv, qsl, lens, tables], "ovstd_prefill")


def ovstd_decode(inp: dict, scale: float, threads: int) -> Impl:
    key = ("ovstd_decode", inp["q"].dtype.str, scale)
    compiled = _compile(key, lambda: _ovstd_decode_model(inp["q"].dtype, scale), threads)
    return _bound_request(compiled, [inp[n] for n in DECODE_INPUTS])


def ovstd_prefill(inp: dict, scale: float, threads: int, max_scores_bytes: float = 2e9) -> Impl:
    t, h = inp["q_nope"].shape[:2]
    length = inp["block_tables"].shape[1] * inp["kv_cache"].shape[1]
    if 4.0 * h * t * length > max_scores_bytes:
        raise Skip(f"scores tensor {4.0 * h * t * length / 1e9:.1f} GB")
    key = ("ovstd_prefill", inp["q_nope"].dtype.str, scale)
    compiled = _compile(key, lambda: _ovstd_prefill_model(inp["q_nope"].dtype, scale), threads)
    return _bound_request(compiled, [inp[n] for n in PREFILL_INPUTS])


# ------------------------------------------------------------------ torch (plain, f32 math)

def _torch(a: np.ndarray):
    import torch
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _torch_out(t) -> np.ndarray:
    import torch
    return t.to(torch.float32).numpy()


def torch_decode(inp: dict, scale: float) -> Impl:
    import torch
    q, cache = _torch(inp["q"]), _torch(inp["kv_cache"])
    tables = _torch(inp["block_tables"]).long()
    batch, m = tables.shape
    padded = m * cache.shape[1]
    pos = torch.arange(padded)
    masked = (pos[None, :] >= _torch(inp["seq_lens"])[:, None]).unsqueeze(1)  # [B, 1, L']
    mask = masked if bool(masked.any()) else None

    def run():
        rows = cache[tables].reshape(batch, padded, W).float()  # gather [B, L', W]
        s = torch.bmm(q.float(), rows.transpose(1, 2)) * scale
        if mask is not None:
            s.masked_fill_(mask, float("-inf"))
        return torch.bmm(torch.softmax(s, dim=-1), rows[..., :R]).to(q.dtype)
    return local_impl(run, _torch_out)


def torch_prefill(inp: dict, scale: float, chunk_bytes: float = 2.5e8) -> Impl:
    """Expanded form, one sequence, queries in chunks so the scores stay under chunk_bytes."""
    import torch
    q_nope, q_pe, cache = _torch(inp["q_nope"]), _torch(inp["q_pe"]), _torch(inp["kv_cache"])
    w_uk, w_uv = _torch(inp["w_uk"]), _torch(inp["w_uv"])
    tables = _torch(inp["block_tables"]).long()[0]
    length = int(inp["seq_lens"][0])
    t, h = q_nope.shape[:2]
    chunk = max(1, int(chunk_bytes // (4 * h * length)))
    qpos = length - t + torch.arange(t)

    def run():
        rows = cache[tables].reshape(-1, W)[:length].float()  # [L, W]
        kv_c = rows[:, :R]
        k = torch.cat([torch.matmul(kv_c, w_uk.float().transpose(1, 2)),  # [H, L, DN]
                       rows[:, R:].unsqueeze(0).expand(h, length, DR)], dim=-1)  # [H, L, DN + DR]
        v = torch.matmul(kv_c, w_uv.float())  # [H, L, DV]
        q = torch.cat([q_nope, q_pe], dim=-1).float().transpose(0, 1)  # [H, T, DN + DR]
        out = torch.empty(t, h, DV)
        for c0 in range(0, t, chunk):
            c1 = min(t, c0 + chunk)
            s = torch.matmul(q[:, c0:c1], k.transpose(1, 2)) * scale  # [H, c, L]
            s.masked_fill_(torch.arange(length)[None, :] > qpos[c0:c1, None], float("-inf"))
            out[c0:c1] = torch.matmul(torch.softmax(s, dim=-1), v).transpose(0, 1)
        return out.to(q_nope.dtype)
    return local_impl(run, _torch_out)


# ------------------------------------------------------------------ onnxruntime (optional)

def ort_impl(op: str, inp: dict, names: list[str], attrs: dict, threads: int) -> Impl:
    import onnxruntime as ort

    from mla_export.ops import kernels_onnxruntime as ok
    if not ok.available():
        raise Skip("libmla_export_ort.so not built")
    arrays = [(n, np.ascontiguousarray(inp[n])) for n in names]
    model = ok.single_op_model([(op, names, attrs, ["output"])], [(n, a.dtype, a.ndim) for n, a in arrays],
                               [("output", arrays[0][1].dtype, 3)])
    sess = ort.InferenceSession(model.SerializeToString(), sess_options=ok.session_options(threads),
                                providers=["CPUExecutionProvider"])
    feeds = {n: ok.ortvalue(a) for n, a in arrays}

    def run():
        _ = arrays  # keep the bound buffers alive
        return sess.run_with_ort_values(["output"], feeds)[0]
    return local_impl(run, ok.to_numpy)


def ort_decode(inp: dict, scale: float, threads: int) -> Impl:
    form = decode_form_inputs(inp)
    return ort_impl("MlaPagedAttention", form, list(form), {"scale": float(scale), "form": 1}, threads)


def ort_prefill(inp: dict, scale: float, threads: int) -> Impl:
    return ort_impl("MlaPagedAttention", inp, PREFILL_INPUTS, {"scale": float(scale), "form": 0}, threads)


# ------------------------------------------------------------------ peers (own process and venv)

class PeerError(Exception):
    pass


class PeerProcess:
    """tools/peer_runner.py under the peer venv's python, one JSON command per line."""

    def __init__(self, python: str, threads: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        runner = Path(__file__).resolve().parent / "peer_runner.py"
        self.proc = subprocess.Popen([python, str(runner)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.dir = Path(tempfile.mkdtemp(prefix="mla_peer_"))
        self.info = self.call({"cmd": "info"})

    def call(self, cmd: dict) -> dict:
        if self.proc.poll() is not None:
            raise PeerError(f"peer process exited (code {self.proc.returncode})")
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise PeerError(f"peer process died (code {self.proc.wait()})")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise PeerError(reply["error"])
        return reply

    def load(self, case: str, kind: str, inp: dict, scale: float) -> None:
        d = self.dir / "inputs"
        d.mkdir(exist_ok=True)
        for name, a in inp.items():
            np.save(d / f"{name}.npy", a.view(np.uint16) if a.dtype == BF16 else a)
            marker = d / f"{name}.bf16"
            marker.touch() if a.dtype == BF16 else marker.unlink(missing_ok=True)
        try:
            self.call({"cmd": "load", "case": case, "dir": str(d), "kind": kind, "scale": scale})
        finally:
            for f in d.iterdir():
                f.unlink()

    def impl(self, case: str, op: str) -> Impl:
        if not self.info["ops"].get(op):
            raise Skip(f"not in vLLM {self.info['library']}")
        out_path = self.dir / "out.npy"

        def times(n: int) -> list[float]:
            return self.call({"cmd": "run", "case": case, "op": op, "reps": n})["times"]

        def output() -> np.ndarray:
            self.call({"cmd": "run", "case": case, "op": op, "reps": 0, "save": str(out_path)})
            out = np.load(out_path)
            out_path.unlink()
            return out
        return Impl(times, output)

    def drop(self, case: str) -> None:
        self.call({"cmd": "drop", "case": case})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        for f in self.dir.rglob("*"):
            if f.is_file():
                f.unlink()
        for d in sorted(self.dir.rglob("*"), reverse=True) + [self.dir]:
            d.rmdir()
