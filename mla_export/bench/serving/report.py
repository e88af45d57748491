"""The sweep's summary: per (concurrency, target) the median and range of each figure over the
rounds, per concurrency the median over rounds of the A/B ratio of two runs made side by side in
the same round (paired, so a slow minute on the shared machine hits both), and a Markdown table."""

from __future__ import annotations

import statistics

from mla_export.bench.serving.metrics import METRICS, percentile_key

THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")


def figure_keys(runs: list[dict]) -> list[str]:
    """The scalar figures present in the runs: throughputs, then mean/median/pXX of each latency."""
    lat = [k for k in runs[0] if not k.startswith("std_") and any(k.endswith(f"_{m}_ms") for m in METRICS)]
    return list(THROUGHPUTS) + lat


def _conc_key(c) -> str:
    return "none" if c is None else str(c)


def summarize(runs: list[dict], labels: list[str]) -> dict:
    if not runs:
        return {"points": [], "ratios": []}
    keys = figure_keys(runs)
    concs = list(dict.fromkeys(r["max_concurrency"] for r in runs))
    points, ratios = [], []
    for c in concs:
        for lab in labels:
            rs = [r for r in runs if r["max_concurrency"] == c and r["label"] == lab]
            if not rs:
                continue
            pt = {"max_concurrency": c, "label": lab, "rounds": len(rs),
                  "completed": sum(r["completed"] for r in rs), "failed": sum(r["failed"] for r in rs),
                  "median": {k: statistics.median(r[k] for r in rs) for k in keys},
                  "min": {k: min(r[k] for r in rs) for k in keys}, "max": {k: max(r[k] for r in rs) for k in keys}}
            points.append(pt)
        if len(labels) == 2:
            a_lab, b_lab = labels
            per_round = {}
            for r in runs:
                if r["max_concurrency"] == c:
                    per_round.setdefault(r["round"], {})[r["label"]] = r
            pairs = [(d[a_lab], d[b_lab]) for d in per_round.values() if a_lab in d and b_lab in d]
            if pairs:
                ratio = {}
                for k in keys:
                    vals = [a[k] / b[k] for a, b in pairs if b[k]]
                    ratio[k] = statistics.median(vals) if vals else None
                ratios.append({"max_concurrency": c, "a": a_lab, "b": b_lab, "pairs": len(pairs),
                               "median_ratio_a_over_b": ratio})
    return {"points": points, "ratios": ratios}


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def markdown(summary: dict, percentiles: list[float]) -> str:
    """One row per (concurrency, target), medians over rounds [min-max]; one A/B row per concurrency.
    The tail columns show the highest of the chosen percentiles."""
    p = f"p{percentile_key(max(percentiles))}" if percentiles else None
    cols = [("req/s", "request_throughput"), ("out tok/s", "output_throughput"),
            ("total tok/s", "total_token_throughput"), ("TTFT median ms", "median_ttft_ms"),
            ("TPOT median ms", "median_tpot_ms"), ("ITL median ms", "median_itl_ms"),
            ("E2EL median ms", "median_e2el_ms")]
    if p:
        cols[4:4] = [(f"TTFT {p} ms", f"{p}_ttft_ms")]
        cols.insert(7, (f"ITL {p} ms", f"{p}_itl_ms"))
    lines = ["| concurrency | target | " + " | ".join(c for c, _ in cols) + " | completed/failed |",
             "|---|---|" + "---|" * len(cols) + "---|"]
    ratio_by_c = {_conc_key(r["max_concurrency"]): r for r in summary["ratios"]}
    concs = list(dict.fromkeys(_conc_key(pt["max_concurrency"]) for pt in summary["points"]))
    for c in concs:
        for pt in (x for x in summary["points"] if _conc_key(x["max_concurrency"]) == c):
            cells = []
            for _, k in cols:
                if k not in pt["median"]:
                    cells.append("-")
                    continue
                cell = _fmt(pt["median"][k])
                if pt["rounds"] > 1:
                    cell += f" [{_fmt(pt['min'][k])}-{_fmt(pt['max'][k])}]"
                cells.append(cell)
            lines.append(f"| {c} | {pt['label']} | " + " | ".join(cells) + f" | {pt['completed']}/{pt['failed']} |")
        r = ratio_by_c.get(c)
        if r:
            cells = [_fmt(r["median_ratio_a_over_b"].get(k)) + "x" if r["median_ratio_a_over_b"].get(k) else "-"
                     for _, k in cols]
            lines.append(f"| {c} | {r['a']}/{r['b']} | " + " | ".join(cells) + f" | {r['pairs']} pairs |")
    return "\n".join(lines) + "\n"
