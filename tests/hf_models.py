"""Test helpers for exported graphs: a paged-cache driver and transformers' logits as the oracle.

`PagedSession` keeps per-sequence token lists and block tables (blocks handed out in a shuffled
order, table padding = -1), builds one step's packed metadata for any mix of prefill chunks and
decode tokens, and calls a backend `run(feeds) -> logits` that owns the cache arrays. The oracle
runs transformers' own forward over each sequence's full token list (no cache) in float32.
"""

from __future__ import annotations

import numpy as np



class PagedSession:
    def __init__(self, block_size: int, num_blocks: int, rng: np.random.Generator):
        self.block_size = block_size
        self.free = list(rng.permutation(num_blocks))  # shuffled: tables are never contiguous
        self.tokens: dict[str, list[int]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.cached: dict[str, int] = {}  # tokens already in the cache

    def add(self, seq: str, tokens) -> None:
        self.tokens[seq] = [int(t) for t in tokens]
        self.blocks[seq] = []
        self.cached[seq] = 0

    def step_feeds(self, plan: list[tuple[str, int]]) -> dict:
        """plan: (sequence, number of its not-yet-cached tokens to run now), in batch order."""
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        for seq, n in plan:
            start = self.cached[seq]
            assert 0 < n <= len(self.tokens[seq]) - start
            end = start + n
            while len(self.blocks[seq]) * self.block_size < end:
                self.blocks[seq].append(int(self.free.pop()))
            for p in range(start, end):
                ids.append(self.tokens[seq][p])
                pos.append(p)
                slots.append(self.blocks[seq][p // self.block_size] * self.block_size + p % self.block_size)
            qsl.append(qsl[-1] + n)
            lens.append(end)
            self.cached[seq] = end
        width = max(len(self.blocks[s]) for s, _ in plan) + 1  # one column of padding
        tables = np.full((len(plan), width), -1, dtype=np.int32)
        for b, (seq, _) in enumerate(plan):
            tables[b, :len(self.blocks[seq])] = self.blocks[seq]
        i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
        return dict(input_ids=i32(ids), positions=i32(pos), slot_mapping=i32(slots), query_start_loc=i32(qsl),
                    seq_lens=i32(lens), block_tables=tables, logits_indices=i32(qsl[1:]) - 1)


def load_hf(model_dir):
    import json
    from pathlib import Path

    import torch
    from transformers import AutoConfig

    from mla_export.checkpoint.presets import SAVED_AS, causal_lm_class

    torch.manual_seed(0)
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    if raw.get("model_type") in SAVED_AS:  # Kimi K2: DeepSeek-V3's code under another model_type (remote code)
        config = AutoConfig.for_model(SAVED_AS[raw["model_type"]])
        config = type(config).from_dict(dict(raw, model_type=SAVED_AS[raw["model_type"]]))
    else:
        config = AutoConfig.from_pretrained(model_dir)
    return causal_lm_class(config).from_pretrained(model_dir, config=config, dtype=torch.float32).eval()


def hf_last_logits(model, tokens) -> np.ndarray:
    """transformers' logits after `tokens` (memoised per model: backends replay the same prefixes)."""
    import torch

    memo = model.__dict__.setdefault("_last_logits_memo", {})
    key = tuple(int(t) for t in tokens)
    if key not in memo:
        with torch.no_grad():
            out = model(torch.tensor([key], dtype=torch.long), use_cache=False)
        memo[key] = out.logits[0, -1].float().numpy()
    return memo[key]


def rel_err(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def drive_and_compare(run, hf, session: PagedSession, prompts: dict, steps: list, tol: float) -> dict:
    """Run `steps` (lists of (seq, n) plans, n = None for one decode token) through `run`; after
    each step append the greedy token to each sequence that reached its end, and compare the
    logits of every row with transformers'. Returns worst relative error and token agreement."""
    for seq, toks in prompts.items():
        session.add(seq, toks)
    worst, agree, total = 0.0, 0, 0
    for plan in steps:
        plan = [(s, 1 if n is None else n) for s, n in plan]
        feeds = session.step_feeds(plan)
        logits = run(feeds)
        assert logits.shape == (len(plan), hf.config.get_text_config().vocab_size) and logits.dtype == np.float32
        for b, (seq, _) in enumerate(plan):
            done = session.cached[seq]
            expected = hf_last_logits(hf, session.tokens[seq][:done])
            err = rel_err(logits[b], expected)
            worst = max(worst, err)
            assert err <= tol, f"{seq} at length {done}: logits max relative error {err:.2e} > {tol}"
            total += 1
            agree += int(np.argmax(logits[b]) == np.argmax(expected))
            if done == len(session.tokens[seq]):  # at the end: greedy next token, as a decode loop would
                session.tokens[seq].append(int(np.argmax(logits[b])))
    return dict(worst=worst, agree=agree, total=total)


