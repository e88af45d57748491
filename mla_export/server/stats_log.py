"""The periodic stats line, as vLLM logs it:

    Avg prompt throughput: 120.0 tokens/s, Avg generation throughput: 45.5 tokens/s, Running: 3 reqs,
    Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%

Throughputs are over the interval since the previous line (prompt tokens count when a prompt's
first token is out, as vLLM counts them); running / waiting and KV cache usage are the engine's
latest snapshot; the prefix cache hit rate is over every lookup since start (in the engine's
unit: tokens). A line is logged only when something happened: tokens in the interval, requests
in the engine, or activity in the interval before (one last line shows the server went idle).

With speculative decoding, vLLM's second line over the same interval (SpecLine):

    SpecDecoding metrics: Mean acceptance length: 2.41, Accepted throughput: 12.00 tokens/s,
    Drafted throughput: 25.50 tokens/s, Accepted: 120 tokens, Drafted: 255 tokens,
    Per-position acceptance rate: 0.706, 0.471, 0.235, Avg Draft acceptance rate: 47.1%
"""

from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["StatsLine", "SpecLine", "run_stats_log"]

log = logging.getLogger("mla_export.server")


class StatsLine:
    def __init__(self):
        self._last: tuple[float, int, int] | None = None  # (time, prompt tokens, generation tokens)
        self._was_active = False

    def update(self, now: float, counters: dict, stats: dict) -> str | None:
        """The line for the interval ending `now`, or None (the first call, or nothing happened).

        `counters`: cumulative {"prompt_tokens", "generation_tokens"} (ServerMetrics.counters());
        `stats`: the engine's snapshot (num_running, num_waiting, kv_blocks_used / _total,
        prefix_cache_queries / _hits)."""
        prompt, gen = int(counters.get("prompt_tokens", 0)), int(counters.get("generation_tokens", 0))
        last, self._last = self._last, (now, prompt, gen)
        if last is None:
            return None
        dt = now - last[0]
        if dt <= 0:
            return None
        d_prompt, d_gen = prompt - last[1], gen - last[2]
        g = lambda key: stats.get(key, 0) or 0  # noqa: E731
        running, waiting = g("num_running"), g("num_waiting")
        active = bool(d_prompt or d_gen or running or waiting)
        was_active, self._was_active = self._was_active, active
        if not active and not was_active:
            return None
        total, queries = g("kv_blocks_total"), g("prefix_cache_queries")
        usage = 100.0 * g("kv_blocks_used") / total if total else 0.0
        hit_rate = 100.0 * g("prefix_cache_hits") / queries if queries else 0.0
        return (f"Avg prompt throughput: {d_prompt / dt:.1f} tokens/s, "
                f"Avg generation throughput: {d_gen / dt:.1f} tokens/s, "
                f"Running: {running} reqs, Waiting: {waiting} reqs, "
                f"KV cache usage: {usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%")


class SpecLine:
    """vLLM's speculative-decoding line over each interval, from the engine's cumulative counters
    (spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _per_pos); None when the
    engine does not speculate or no draft was verified in the interval."""

    def __init__(self):
        self._last: tuple[float, int, int, int, list[int]] | None = None

    def update(self, now: float, stats: dict) -> str | None:
        if "spec_decode_num_drafts" not in stats:
            return None
        cur = (now, int(stats["spec_decode_num_drafts"]), int(stats["spec_decode_num_draft_tokens"]),
               int(stats["spec_decode_num_accepted_tokens"]),
               [int(x) for x in stats.get("spec_decode_num_accepted_tokens_per_pos") or []])
        last, self._last = self._last, cur
        if last is None or cur[0] <= last[0]:
            return None
        dt = cur[0] - last[0]
        drafts, drafted, accepted = cur[1] - last[1], cur[2] - last[2], cur[3] - last[3]
        if drafts <= 0:
            return None
        per_pos = [(c - (last[4][i] if i < len(last[4]) else 0)) / drafts for i, c in enumerate(cur[4])]
        return (f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
                f"Accepted throughput: {accepted / dt:.2f} tokens/s, Drafted throughput: {drafted / dt:.2f} tokens/s, "
                f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
                f"Per-position acceptance rate: {', '.join(f'{r:.3f}' for r in per_pos)}, "
                f"Avg Draft acceptance rate: {100.0 * accepted / drafted if drafted else 0.0:.1f}%")


async def run_stats_log(metrics, client, interval_s: float) -> None:
    """Log the stats line every `interval_s` seconds while there is activity (a task of the app's
    lifespan, cancelled at shutdown)."""
    line, spec = StatsLine(), SpecLine()
    stats = client.stats()
    line.update(time.monotonic(), metrics.counters(), stats)
    spec.update(time.monotonic(), stats)
    while True:
        await asyncio.sleep(interval_s)
        try:
            stats, now = client.stats(), time.monotonic()
            texts = [line.update(now, metrics.counters(), stats), spec.update(now, stats)]
        except Exception as e:  # noqa: BLE001 - a log line must never take the server down
            log.warning("stats line failed: %s", e)
            continue
        for text in texts:
            if text:
                log.info("%s", text)
