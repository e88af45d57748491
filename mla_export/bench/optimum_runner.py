#!/usr/bin/env python
"""One grid point of the end-to-end benchmark (mla_export.bench) for the optimum-intel peer, run
by the optimum venv's python (optimum-intel 2.2.0, transformers 4.53.3, openvino): never imports
mla_export (it is run by path, from a source tree or an installed wheel alike).

    <optimum venv>/bin/python mla_export/bench/optimum_runner.py --spec SPEC.json

SPEC: {"optimum_dir": the `make_and_export.py export --mode native` output, "prompts_file": JSON
list of token-id lists (one batch, equal lengths), "new_tokens", "threads",
"kv_cache_precision": null (the plugin's default) or e.g. "f32"}.
Prints one line `RESULT {json}`: ttft_s, decode_tok_s (batch / median full-batch step),
decode_tok_s_mean, peak_rss_mb, tokens, the plugin's INFERENCE_PRECISION_HINT and
KV_CACHE_PRECISION read back from the compiled model, the live cache's values per token.
The timing conventions are the same as the transformers worker's (mla_export/bench/workers.py:
HF generate with a logits processor that stamps each step).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _common():
    """mla_export/bench/common.py loaded by path (it imports the standard library only), so the
    RSS helpers have one copy while this script still never imports the mla_export package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mla_bench_common", os.path.join(os.path.dirname(__file__), "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_COMMON = _common()


def rss_mb(peak=True):
    return _COMMON.peak_rss_mb() if peak else _COMMON.current_rss_mb()


def run(spec):
    import numpy as np
    import openvino
    import optimum.intel
    import torch
    import transformers
    from optimum.intel import OVModelForCausalLM

    threads = spec["threads"]
    torch.set_num_threads(threads)
    prompts = json.load(open(spec["prompts_file"]))
    batch, new, plen = len(prompts), spec["new_tokens"], len(prompts[0])
    ov_config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "CACHE_DIR": ""}
    if spec.get("kv_cache_precision"):
        ov_config["KV_CACHE_PRECISION"] = spec["kv_cache_precision"]
    t0 = time.perf_counter()
    model = OVModelForCausalLM.from_pretrained(spec["optimum_dir"], device="CPU", ov_config=ov_config, compile=True)
    load_s = time.perf_counter() - t0
    load_rss = rss_mb(peak=False)
    cm = model.request.get_compiled_model()

    def prop(k):
        try:
            v = cm.get_property(k)
            return v.get_type_name() if hasattr(v, "get_type_name") else str(v)
        except Exception as e:  # noqa: BLE001
            return f"n/a ({type(e).__name__})"

    gc = model.generation_config
    gc.eos_token_id = None  # EOS ignored, as for the other systems
    gc.pad_token_id = 0

    def gen(ids):
        return _COMMON.timed_generate(model, gc, ids, new)

    gen([p[:16] for p in prompts])  # warm-up
    t_start, stamps, out = gen(prompts)
    peak = rss_mb()
    seqs = out[:, plen:].tolist()
    dts = [b - a for a, b in zip(stamps, stamps[1:])]
    full = sorted(dts)
    res = {"ok": True, "load_s": load_s, "rss_after_load_mb": load_rss, "peak_rss_mb": peak,
           "ttft_s": stamps[0] - t_start, "decode_steps": len(dts), "decode_full_batch_steps": len(dts),
           "e2e_s": stamps[-1] - t_start, "tokens": seqs,
           "inference_precision": prop("INFERENCE_PRECISION_HINT"), "kv_cache_precision": prop("KV_CACHE_PRECISION"),
           "threads": prop("INFERENCE_NUM_THREADS"), "route": "make_and_export.py export --mode native",
           "versions": {"optimum-intel": getattr(optimum.intel, "__version__", "?"),
                        "transformers": transformers.__version__, "openvino": openvino.get_version()}}
    if dts:
        med = statistics.median(full)
        res.update(step_ms_median=med * 1e3, decode_tok_s=batch / med, decode_tok_s_mean=batch * len(dts) / sum(dts))
    # the live stateful cache: values per token per layer (shape only; the plugin may store them
    # at KV_CACHE_PRECISION internally, the state tensor is handed out at the model's type)
    try:
        states = model.request.query_state()
        cfg = json.load(open(os.path.join(spec["optimum_dir"], "config.json")))
        L = cfg["num_hidden_layers"]
        s0 = states[0].state
        shapes = {s.name: list(s.state.shape) for s in states[:2]}
        n_elems = sum(int(np.prod(v)) for v in shapes.values())  # one K and one V state = one layer
        tokens_cached = batch * (plen + new - 1)
        res["kv_states"] = {"n_states": len(states), "first_two_shapes": shapes, "state_type": str(s0.element_type),
                            "values_per_token_per_layer_measured": n_elems / tokens_cached}
        kvb = {"f32": 4, "bf16": 2, "f16": 2, "u8": 1, "i8": 1}.get(res["kv_cache_precision"].lower())
        if kvb:
            res["kv_bytes_per_token_measured"] = n_elems / tokens_cached * L * kvb
    except Exception as e:  # noqa: BLE001
        res["kv_states"] = f"n/a ({type(e).__name__}: {e})"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    try:
        res = run(spec)
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "peak_rss_mb": rss_mb()}
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
