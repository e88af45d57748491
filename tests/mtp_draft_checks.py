"""The MTP draft tests' shared check (tests/test_spec_decode_mtp.py, test_spec_decode_mtp_dsa.py):
an engine runs prompts with two MTP drafts a step while every proposal is compared with the
float64 oracle (mla_export/ops/reference_mtp.py): draft 1 = the argmax of the MTP layer fed the
main model's hidden states, draft 2 = the argmax of the next row fed draft 1 and h'. Near-ties
(top-2 gap < 1e-3) are skipped."""

from __future__ import annotations

import numpy as np

from mla_export.checkpoint.config import MLAModelConfig
from mla_export.checkpoint.reader import CheckpointReader
from mla_export.ops.reference_mtp import main_forward, mtp_forward
from mla_export.runtime.engine import LLMEngine
from mla_export.runtime.sampling import SamplingParams

__all__ = ["run_checked_drafts", "assert_forced_events"]


def run_checked_drafts(ckpt, out, prompts: list[list[int]], **engine_kw) -> tuple[list[int], dict]:
    """(the computed length of each checked draft's sequence, the engine's stats)."""
    cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
    cache: dict = {}

    def weights(name):
        if name not in cache:
            cache[name] = rd.get(name).astype(np.float64)
        return cache[name]

    engine = LLMEngine(out, precision="f32", speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                       **engine_kw)
    propose, checked = engine._mtp.propose, []

    def check(*args):
        propose(*args)
        for req in engine.scheduler.running:
            if not req.spec_token_ids:
                continue
            toks, c = req.all_token_ids, req.num_computed_tokens
            assert len(toks) == c + 1
            h, _ = main_forward(toks[:c], weights, cfg)
            h2, logits = mtp_forward(toks[1:c + 1], h, np.arange(c), weights, cfg)
            rows = [logits[-1]]
            if len(req.spec_token_ids) > 1:
                _, more = mtp_forward(toks[1:c + 1] + req.spec_token_ids[:1], np.concatenate([h, h2[-1:]]),
                                      np.arange(c + 1), weights, cfg)
                rows.append(more[-1])
            for draft, row in zip(req.spec_token_ids, rows):
                top2 = np.sort(row)[-2:]
                if top2[1] - top2[0] > 1e-3:
                    assert draft == int(np.argmax(row)), (req.request_id, c)
                    checked.append(c)

    engine._mtp.propose = check
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    while engine.has_unfinished_requests():
        assert all(o.error is None for o in engine.step())
    return checked, engine.stats()


def assert_forced_events(stats: dict, engine_kw: dict) -> None:
    """The case the engine settings were chosen to force did happen."""
    if "max_num_seqs" in engine_kw:
        assert stats["prefix_cache_hits"] > 0
    if "num_blocks" in engine_kw:
        assert stats["num_preemptions"] > 0
