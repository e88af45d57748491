"""The command line of tools/bench_serve.py: vLLM's `vllm bench serve` flags for the random dataset,
plus --sweep-concurrency, --rounds and a second target (--base-url-b) run alternately."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path

from mla_export.bench.common import machine_info
from mla_export.bench.serving.dataset import load_tokenizer
from mla_export.bench.serving.metrics import METRICS, percentile_key
from mla_export.bench.serving.report import markdown, summarize
from mla_export.bench.serving.runner import ENDPOINT, RunConfig, Target, sweep

def protocol(prompt_format: str) -> str:
    form = "token-id prompts" if prompt_format == "token-ids" else "text prompts"
    return (f"vllm bench serve: random dataset as {form}, streamed /v1/completions with "
            "stream_options.include_usage, vLLM's metrics and result field names")


def _positive_int_list(flag: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag}: a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{flag}: integers >= 1, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench_serve.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    t = ap.add_argument_group("targets")
    t.add_argument("--base-url", help="server A, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=8000)
    t.add_argument("--base-url-b", help="server B, run alternately with A (A B A B) on the same prompts")
    t.add_argument("--label", default=None, help="name of A in the results (default: A)")
    t.add_argument("--label-b", default=None, help="name of B in the results (default: B)")
    t.add_argument("--model", help="model name sent to A (default: the first id of its /v1/models)")
    t.add_argument("--model-b", help="model name sent to B (default: the first id of its /v1/models)")
    t.add_argument("--endpoint", default=ENDPOINT, help="only /v1/completions (the streamed text completion)")
    t.add_argument("--backend", default="openai", help="only 'openai' (an OpenAI-compatible completions server)")
    d = ap.add_argument_group("dataset (vLLM's random dataset, as text)")
    d.add_argument("--dataset-name", default="random", help="only 'random'")
    d.add_argument("--tokenizer", required=True,
                   help="tokenizer.json or an export directory holding one (the GGUF must share its vocabulary)")
    d.add_argument("--num-prompts", type=int, default=1000)
    d.add_argument("--prompt-format", choices=("text", "token-ids"), default="text",
                   help="send the prompts as text (vLLM's client) or as token ids: the same tokens to every "
                        "server even when its tokenizer splits the text differently (llama.cpp's GGUF "
                        "pre-tokenizer of a converted checkpoint can); both servers take token-id prompts")
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=128)
    d.add_argument("--random-range-ratio", type=float, default=0.0)
    d.add_argument("--seed", type=int, default=0)
    lo = ap.add_argument_group("load")
    lo.add_argument("--request-rate", type=float, default=float("inf"),
                    help="requests per second (inf: all at t=0; else Poisson arrivals)")
    lo.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    lo.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    lo.add_argument("--sweep-concurrency", default=None,
                    help="comma-separated concurrencies run one after another, e.g. 1,2,4,8,16")
    lo.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep; the summary takes medians")
    lo.add_argument("--num-warmups", type=int, default=0, help="warm-up requests before each run (not timed)")
    lo.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                    help="send ignore_eos so every request makes its output length (vLLM forces it for random)")
    lo.add_argument("--temperature", type=float, default=None, help="sent when given (0: greedy on both servers)")
    lo.add_argument("--extra-body", type=json.loads, default=None, help="JSON object merged into every request body")
    o = ap.add_argument_group("results")
    o.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                   help=f"comma-separated among {','.join(METRICS)}")
    o.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 50,90,99")
    o.add_argument("--result-dir", default=".", help="directory of the result JSON")
    o.add_argument("--result-filename", default=None, help="default: bench_serve-<date>.json")
    o.add_argument("--save-detailed", action="store_true", help="also the per-request arrays (vLLM's names)")
    o.add_argument("--markdown", default=None, help="also write the summary table to this Markdown file")
    return ap


def _config(ap: argparse.ArgumentParser, a) -> tuple[list[Target], RunConfig, list[int | None]]:
    if a.backend != "openai":
        ap.error(f"--backend: only 'openai' is implemented, got {a.backend!r}")
    if a.endpoint != ENDPOINT:
        ap.error(f"--endpoint: only {ENDPOINT} is implemented, got {a.endpoint!r}")
    if a.dataset_name != "random":
        ap.error(f"--dataset-name: only 'random' is implemented, got {a.dataset_name!r}")
    for flag, v in (("--num-prompts", a.num_prompts), ("--random-input-len", a.random_input_len),
                    ("--random-output-len", a.random_output_len), ("--rounds", a.rounds)):
        if v < 1:
            ap.error(f"{flag} must be >= 1, got {v}")
    if a.num_warmups < 0:
        ap.error(f"--num-warmups must be >= 0, got {a.num_warmups}")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        ap.error(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if not (a.request_rate > 0) or math.isnan(a.request_rate):
        ap.error(f"--request-rate must be > 0 (or inf), got {a.request_rate}")
    if not (a.burstiness > 0) or math.isinf(a.burstiness):
        ap.error(f"--burstiness must be a finite number > 0, got {a.burstiness}")
    if a.sweep_concurrency and a.max_concurrency is not None:
        ap.error("--sweep-concurrency and --max-concurrency: give one (the sweep sets the concurrency of each run)")
    try:
        concs = _positive_int_list("--sweep-concurrency", a.sweep_concurrency) if a.sweep_concurrency \
            else [a.max_concurrency]
        pm = tuple(m for m in a.percentile_metrics.split(",") if m)
        bad = set(pm) - set(METRICS)
        if bad:
            raise argparse.ArgumentTypeError(f"--percentile-metrics: unknown {sorted(bad)} (allowed: {','.join(METRICS)})")
        pcts = [float(p) for p in a.metric_percentiles.split(",") if p]
        if not pcts or any(not 0 < p <= 100 for p in pcts):
            raise argparse.ArgumentTypeError(f"--metric-percentiles: values in (0, 100], got {a.metric_percentiles!r}")
    except (argparse.ArgumentTypeError, ValueError) as e:
        ap.error(str(e))
    if a.extra_body is not None and not isinstance(a.extra_body, dict):
        ap.error("--extra-body must be a JSON object")
    extra = dict(a.extra_body or {})
    if a.temperature is not None:
        extra["temperature"] = a.temperature
    base_a = (a.base_url or f"http://{a.host}:{a.port}").rstrip("/")
    targets = [Target(a.label or "A", base_a, a.model)]
    if a.base_url_b:
        targets.append(Target(a.label_b or "B", a.base_url_b.rstrip("/"), a.model_b))
        if targets[0].label == targets[1].label:
            ap.error(f"--label and --label-b must differ, both are {targets[0].label!r}")
    elif a.label_b or a.model_b:
        ap.error("--label-b / --model-b need --base-url-b")
    cfg = RunConfig(num_prompts=a.num_prompts, input_len=a.random_input_len, output_len=a.random_output_len,
                    range_ratio=a.random_range_ratio, request_rate=a.request_rate, burstiness=a.burstiness,
                    num_warmups=a.num_warmups, ignore_eos=a.ignore_eos, seed=a.seed, percentiles=pcts,
                    percentile_metrics=pm, extra_body=extra or None, save_detailed=a.save_detailed,
                    prompt_format=a.prompt_format)
    return targets, cfg, concs


def print_run(res: dict, pcts: list[float]) -> None:
    """vLLM's result block, one per run."""
    print("{:=^60}".format(f" {res['label']}  round {res['round']}  concurrency {res['max_concurrency']} "))
    rows = [("Successful requests:", res["completed"]), ("Failed requests:", res["failed"]),
            ("Benchmark duration (s):", f"{res['duration']:.2f}"), ("Total input tokens:", res["total_input_tokens"]),
            ("Total generated tokens:", res["total_output_tokens"]),
            ("Request throughput (req/s):", f"{res['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{res['output_throughput']:.2f}"),
            ("Peak output token throughput (tok/s):", f"{res['max_output_tokens_per_s']:.2f}"),
            ("Peak concurrent requests:", res["max_concurrent_requests"]),
            ("Total token throughput (tok/s):", f"{res['total_token_throughput']:.2f}")]
    for m, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        if f"mean_{m}_ms" in res:
            rows += [(f"Mean {name} (ms):", f"{res[f'mean_{m}_ms']:.2f}"),
                     (f"Median {name} (ms):", f"{res[f'median_{m}_ms']:.2f}")]
            rows += [(f"P{percentile_key(p)} {name} (ms):", f"{res[f'p{percentile_key(p)}_{m}_ms']:.2f}") for p in pcts]
    for k, v in rows:
        print(f"{k:<40} {v}")
    src = res["output_tokens_from"]
    print(f"{'Output tokens counted from:':<40} usage {src['usage']}, tokenizer {src['tokenizer']}")
    for e in res["errors_sample"]:
        print(f"  error: {e[:300]}")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    targets, cfg, concs = _config(ap, a)
    try:
        tok = load_tokenizer(a.tokenizer)
    except ValueError as e:
        ap.error(str(e))
    out_dir = Path(a.result_dir)
    out_path = out_dir / (a.result_filename or f"bench_serve-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    print(f"{protocol(a.prompt_format)}\ntargets: " + ", ".join(f"{t.label}={t.base_url}" for t in targets)
          + f"; concurrencies {concs}; rounds {a.rounds}; {cfg.num_prompts} prompts of "
          f"{cfg.input_len} -> {cfg.output_len} tokens; request rate {cfg.request_rate}")
    try:
        runs = sweep(targets, cfg, concs, a.rounds, tok, on_result=lambda r: print_run(r, cfg.percentiles))
    except (RuntimeError, ValueError) as e:
        print(f"bench_serve: {e}", file=sys.stderr)
        return 1
    labels = [t.label for t in targets]
    summary = summarize(runs, labels)
    table = markdown(summary, cfg.percentiles)
    doc = {"schema": "mla-export bench_serve 1", "protocol": protocol(a.prompt_format), "date": datetime.now().isoformat(timespec="seconds"),
           "machine": machine_info(), "argv": sys.argv[1:] if argv is None else list(argv),
           "config": {"num_prompts": cfg.num_prompts, "random_input_len": cfg.input_len,
                      "random_output_len": cfg.output_len, "random_range_ratio": cfg.range_ratio,
                      "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
                      "burstiness": cfg.burstiness, "concurrencies": concs, "rounds": a.rounds,
                      "num_warmups": cfg.num_warmups, "ignore_eos": cfg.ignore_eos, "seed": cfg.seed,
                      "tokenizer": str(a.tokenizer), "metric_percentiles": cfg.percentiles,
                      "percentile_metrics": list(cfg.percentile_metrics), "extra_body": cfg.extra_body},
           "targets": [{"label": t.label, "base_url": t.base_url} for t in targets],
           "runs": runs, "summary": summary}
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n" + table)
    print(f"results: {out_path}")
    if a.markdown:
        Path(a.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(a.markdown).write_text(f"# Serving benchmark ({doc['date']})\n\n{doc['protocol']}.\n\n{table}")
        print(f"table: {a.markdown}")
    return 0
