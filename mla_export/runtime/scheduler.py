"""The scheduler: which requests run in a step, and how many of their tokens.

One rule serves prefill and decode (vLLM v1's unified scheduler): every request has tokens
whose cache rows are still missing (`num_tokens - num_computed_tokens`); a step gives each
scheduled request a number of them, within a token budget. So a decode is 1 token, a prompt
is split into chunks when the budget runs short (chunked prefill), and prompts and decodes
share a step.

Order: running requests first, oldest first (decodes and unfinished prefills never starve),
then waiting requests in arrival order while the budget, `max_num_seqs` and free blocks last
(continuous batching: new requests join as soon as there is room).

Preemption by recompute: when a running request needs a block and none is free, the newest
running request gives all its blocks back and goes to the front of the waiting queue; when
admitted again it recomputes its prompt and the tokens it had generated (its prefix-cached
blocks may make that cheap), then continues, so its output is the same.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .kv_cache import KVCacheManager
from .request import Request, RequestStatus

__all__ = ["Scheduler", "SchedulerOutput"]


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, number of new tokens)
    preempted: list[Request] = field(default_factory=list)
    # (source, destination) block copies to apply to the cache memory before the step runs
    # (copy-on-write of shared or prefix-cached blocks; see kv_cache.py).
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.kv = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # of which found in the prefix cache
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if req.spec_token_ids:  # drafts follow its last sampled token (the one token it lacks)
                del req.spec_token_ids[budget - num_new:]  # the budget cuts drafts first
                if req.spec_token_ids and self.kv.allocate_slots(
                        req.request_id, req.num_computed_tokens, num_new + len(req.spec_token_ids)):
                    out.scheduled.append((req, num_new + len(req.spec_token_ids)))
                    budget -= num_new + len(req.spec_token_ids)
                    i += 1
                    continue
                req.spec_token_ids.clear()  # no room for the drafts: run it plain, preempt nobody for a guess
            while not self.kv.allocate_slots(req.request_id, req.num_computed_tokens, num_new):
                victim = self.running.pop()  # the newest; never one scheduled already (those sit before i)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.scheduled.append((req, num_new))
                budget -= num_new
                i += 1

        # New requests only when nobody had to give blocks back in this step.
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            # A request still wanting its prompt logprobs needs the logits of every prompt row,
            # which a prefix cache hit would skip (vLLM skips the lookup for it too).
            lookup = not req.needs_prompt_logits
            blocks, num_cached = self.kv.get_computed_blocks(req.request_id, req.all_token_ids) if lookup else ([], 0)
            num_new = min(req.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(req.request_id, num_cached, num_new, blocks):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:  # not again after a preemption: the queue time is the first wait
                req.first_scheduled_time = time.time()
            req.num_computed_tokens = num_cached
            req.num_cached_prompt_tokens += min(num_cached, req.num_prompt_tokens)
            if lookup:
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += num_cached
            self.running.append(req)
            out.scheduled.append((req, num_new))
            budget -= num_new
        out.blocks_to_copy = self.kv.take_block_copies()
        return out

    def update_after_step(self, out: SchedulerOutput) -> None:
        """The step ran: the scheduled rows are in the cache; register newly full blocks. A
        request's draft rows are written but not committed: `accept_drafts` commits the accepted ones."""
        for req, num_new in out.scheduled:
            num_new -= len(req.spec_token_ids)
            start = req.num_computed_tokens
            req.num_computed_prompt_tokens += max(0, min(start + num_new, req.num_prompt_tokens) - start)
            req.num_computed_tokens = start + num_new
            self.kv.cache_full_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)

    def accept_drafts(self, req: Request, num_accepted: int) -> None:
        """After a verify step: the first `num_accepted` draft rows hold accepted tokens (now in the
        request's output, hence in all_token_ids), so they are committed; the rows of rejected
        drafts lie past num_computed_tokens, where attention never reads (it stops at seq_lens)
        and the next tokens overwrite them. Blocks holding only rejected rows are returned, and
        full blocks of committed tokens enter the prefix cache (hashes never cover a draft)."""
        req.num_computed_tokens += num_accepted
        self.kv.free_tail(req.request_id, req.num_computed_tokens)
        self.kv.cache_full_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)

    def finish(self, req: Request, reason: str) -> None:
        """Stop a request (done or aborted) and free its blocks."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.spec_token_ids.clear()  # it recomputes from its committed tokens; drafts are proposed again later
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
