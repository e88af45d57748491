#!/usr/bin/env python
"""End-to-end error of each latent-cache format against the f32 cache (issue 15).

For each tiny test model (V2-Lite-like, V3-like, Kimi-like; random weights, f32 weights) the
checkpoint is exported once per --kv-dtype and the same teacher-forced schedule runs through
each OpenVINO IR at f32 inference precision: several sequences prefilled together (one in two
chunks), then decode steps whose tokens are the f32-cache run's greedy choices, so every format
sees the same inputs and only its cache rounding differs. Per step and sequence: the logits'
max relative error against the f32 cache (max |l - l32| / max |l32|) and whether the greedy
token equals f32's; agreement is counted on the decisive steps, where f32's top-2 logit margin
exceeds 0.05 (the f32 cache itself matches transformers to 1e-4, tests/test_export_models.py).

    python tools/kv_dtype_accuracy.py --num-seqs 32   # the table in docs/KV_CACHE.md (4 by default)
    python tools/kv_dtype_accuracy.py --json out.json

Needs torch + transformers (to make the checkpoints), like the export.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from mla_export.formats.kv_formats import KV_DTYPES  # every registered cache format
MARGIN = 0.05  # decisive steps: f32's top-2 logit margin above this

NO_YARN = dict(rope_type="default", rope_theta=10000.0)
CONFIGS = {
    # DeepSeek-V2-Lite's structure: no q_lora, greedy softmax routing, 2 shared experts, YaRN
    "v2-lite-like": ("deepseek_v2", dict(q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1,
                                         n_shared_experts=2, num_experts_per_tok=6, n_routed_experts=16)),
    # DeepSeek-V3's: q_lora, group-limited sigmoid routing with bias, YaRN, interleaved RoPE (the tiny preset)
    "v3-like": ("deepseek_v3", {}),
    # Kimi K2's: V3 architecture, ungrouped routing over many experts (8 of them per token),
    # twice the heads, routed scaling 2.827, one dense layer
    "kimi-like": ("deepseek_v3", dict(n_group=1, topk_group=1, n_routed_experts=32, num_experts_per_tok=8,
                                      num_attention_heads=8, num_key_value_heads=8, routed_scaling_factor=2.827,
                                      first_k_dense_replace=1)),
}
SEEDS = {"v2-lite-like": 21, "v3-like": 22, "kimi-like": 23}


def export(ckpt: Path, out: Path, kv_dtype: str) -> Path:
    from mla_export.export import export_model

    export_model(ckpt, out, fmt="openvino", block_size=16, kv_dtype=kv_dtype, weight_dtype="f32")
    return out / "openvino_model.xml"


class Runner:
    """One compiled IR and its caches; step(plan) runs (seq, tokens) chunks packed in one step."""

    def __init__(self, xml: Path, kv_dtype: str, num_layers: int, r: int, dr: int, num_blocks: int,
                 block_size: int = 16, seed: int = 0):
        from mla_export.formats import kv_formats
        from mla_export import ov_core
        from mla_export.ops.ov_tensors import cache_binding, shared_tensor

        core = ov_core()
        self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                              "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
        self.request = self.compiled.create_infer_request()
        self.caches = [kv_formats.allocate(kv_dtype, num_blocks, block_size, r, dr) for _ in range(num_layers)]
        for i, c in enumerate(self.caches):
            self.request.set_tensor(f"kv_cache.{i}", shared_tensor(cache_binding(c)))
        self.bs = block_size
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))  # shuffled block ids
        self.blocks: dict[str, list[int]] = {}
        self.length: dict[str, int] = {}

    def step(self, plan: list[tuple[str, list[int]]]) -> np.ndarray:
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        for seq, toks in plan:
            start = self.length.setdefault(seq, 0)
            blocks = self.blocks.setdefault(seq, [])
            end = start + len(toks)
            while len(blocks) * self.bs < end:
                blocks.append(int(self.free.pop()))
            ids += toks
            pos += list(range(start, end))
            slots += [blocks[p // self.bs] * self.bs + p % self.bs for p in range(start, end)]
            qsl.append(qsl[-1] + len(toks))
            lens.append(end)
            self.length[seq] = end
        width = max(len(self.blocks[s]) for s, _ in plan) + 1
        tables = np.full((len(plan), width), -1, np.int32)
        for b, (seq, _) in enumerate(plan):
            tables[b, :len(self.blocks[seq])] = self.blocks[seq]
        i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731
        feeds = dict(input_ids=i32(ids), positions=i32(pos), slot_mapping=i32(slots), query_start_loc=i32(qsl),
                     seq_lens=i32(lens), block_tables=tables, logits_indices=i32(qsl[1:]) - 1)
        for name, arr in feeds.items():
            self.request.set_tensor(name, __import__("openvino").Tensor(arr))
        self.request.infer()
        return self.request.get_tensor("logits").data.astype(np.float64)


def measure(name: str, work: Path, kv_dtypes=KV_DTYPES, prompt_len: int = 96, decode_steps: int = 24,
            num_seqs: int = 4, log=print) -> dict:
    """{kv_dtype: {worst_rel_err, median_rel_err, decisive, agree, steps, bytes_per_token}} for one config."""
    from mla_export.formats.kv_formats import row_bytes
    from mla_export.checkpoint.presets import make_checkpoint

    model_type, overrides = CONFIGS[name]
    ckpt = make_checkpoint(work / name / "ckpt", model_type, seed=SEEDS[name], **overrides)
    cfg = json.loads((ckpt / "config.json").read_text())
    r, dr, layers, vocab = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["num_hidden_layers"], cfg["vocab_size"]
    rng = np.random.default_rng(SEEDS[name])
    prompts = {f"s{i}": rng.integers(2, vocab, prompt_len + 7 * (i % 8)).tolist() for i in range(num_seqs)}
    num_blocks = num_seqs * ((prompt_len + 7 * 7 + decode_steps) // 16 + 2)
    runners = {kv: Runner(export(ckpt, work / name / kv, kv), kv, layers, r, dr, num_blocks, seed=SEEDS[name])
               for kv in ("f32",) + tuple(k for k in kv_dtypes if k != "f32")}

    # Step 1: s0 whole, s1 first half (chunked prefill), the rest whole; step 2: s1's second half
    # with the others' first decode token; then decode steps, all teacher-forced by f32's tokens.
    half = len(prompts["s1"]) // 2
    first = [(s, p if s != "s1" else p[:half]) for s, p in prompts.items()]
    logits = {kv: [] for kv in runners}
    rows = {kv: ru.step(first) for kv, ru in runners.items()}
    plan_seqs = [s for s, _ in first]
    for kv in runners:
        logits[kv].append(np.delete(rows[kv], plan_seqs.index("s1"), axis=0))  # s1 is mid-prompt
    nxt = {s: int(np.argmax(rows["f32"][b])) for b, s in enumerate(plan_seqs) if s != "s1"}
    second = [("s1", prompts["s1"][half:])] + [(s, [t]) for s, t in nxt.items()]
    for _ in range(decode_steps):
        rows = {kv: ru.step(second) for kv, ru in runners.items()}
        for kv in runners:
            logits[kv].append(rows[kv])
        second = [(s, [int(np.argmax(rows["f32"][b]))]) for b, (s, _) in enumerate(second)]
    ref = np.concatenate(logits["f32"])
    top2 = np.sort(ref, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > MARGIN
    out = {}
    for kv in runners:
        got = np.concatenate(logits[kv])
        err = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
        agree = np.argmax(got, axis=1) == np.argmax(ref, axis=1)
        out[kv] = dict(worst_rel_err=float(err.max()), median_rel_err=float(np.median(err)),
                       p90_rel_err=float(np.percentile(err, 90)), finite=bool(np.isfinite(got).all()),
                       steps=int(len(err)), decisive=int(decisive.sum()), agree_decisive=int(agree[decisive].sum()),
                       agree_all=int(agree.sum()), max_margin_flipped=float((top2[:, 1] - top2[:, 0])[~agree].max(initial=0)),
                       bytes_per_token=layers * row_bytes(kv, r, dr))
        log(f"{name:<13} {kv:<5} worst {out[kv]['worst_rel_err']:.2e} p90 {out[kv]['p90_rel_err']:.2e} "
            f"median {out[kv]['median_rel_err']:.2e} "
            f"greedy {out[kv]['agree_decisive']}/{out[kv]['decisive']} decisive, {out[kv]['agree_all']}/{len(err)} all")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--kv-dtypes", default=",".join(KV_DTYPES))
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--num-seqs", type=int, default=4, help="sequences (prompt seed: the checkpoint seed)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kv_accuracy_") as tmp:
        for name in args.configs.split(","):
            results[name] = measure(name, Path(tmp), args.kv_dtypes.split(","), args.prompt_len, args.decode_steps,
                                    args.num_seqs)
    print("\n| model | cache | bytes/token/layer (576 wide) | logits max rel err vs f32: median / p90 / worst | greedy = f32 (decisive steps) | largest margin flipped |")
    print("|---|---|---:|---|---:|---:|")
    from mla_export.formats.kv_formats import row_bytes
    for name, res in results.items():
        for kv, m in res.items():
            print(f"| {name} | {kv} | {row_bytes(kv, 512, 64)} | {m['median_rel_err']:.1e} / {m['p90_rel_err']:.1e} / "
                  f"{m['worst_rel_err']:.1e} | {m['agree_decisive']}/{m['decisive']} | {m['max_margin_flipped']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
