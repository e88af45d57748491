"""The periodic stats line, as vLLM logs it:

    Avg prompt throughput: 120.0 tokens/s, Avg generation throughput: 45.5 tokens/s, Running: 3 reqs,
    Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%

Throughputs are over the interval since the previous line (prompt tokens count when a prompt's
first token is out, as vLLM counts them); running / waiting and KV cache usage are the engine's
latest snapshot; the prefix cache hit rate is over every lookup since start (in the engine's
unit: tokens). A line is logged only when something happened: tokens in the interval, requests
in the engine, or activity in the interval before (one last line shows the server went idle).
"""

from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["StatsLine", "run_stats_log"]

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


async def run_stats_log(metrics, client, interval_s: float) -> None:
    """Log the stats line every `interval_s` seconds while there is activity (a task of the app's
    lifespan, cancelled at shutdown)."""
    line = StatsLine()
    line.update(time.monotonic(), metrics.counters(), client.stats())
    while True:
        await asyncio.sleep(interval_s)
        try:
            text = line.update(time.monotonic(), metrics.counters(), client.stats())
        except Exception as e:  # noqa: BLE001 - a log line must never take the server down
            log.warning("stats line failed: %s", e)
            continue
        if text:
            log.info("%s", text)
