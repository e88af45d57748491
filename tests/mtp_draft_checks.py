"""The MTP draft tests' shared runs and check (tests/test_spec_decode_mtp.py, test_spec_decode_mtp_dsa.py):
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

__all__ = ["GREEDY", "RUNTIMES", "run", "tokens", "mtp", "run_checked_drafts", "assert_forced_events", "export_notes",
           "llm_greedy_with_and_without_mtp", "serve_spec_metrics",
           "assert_draft_inputs_refused", "assert_drafts_keep_greedy"]

RUNTIMES = ("openvino", "onnxruntime")
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


def run(out_dir, prompts, params=GREEDY, spec=None, **kw):
    """({request id: (token ids, metrics)}, stats)."""
    engine = LLMEngine(out_dir, precision="f32", speculative_config=spec, **kw)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            assert o.error is None, o.error
            if o.finished:
                outs[o.request_id] = (o.token_ids, o.metrics)
    return outs, engine.stats()


def tokens(outs):
    return {k: v[0] for k, v in outs.items()}


def mtp(k: int, alias: str = "mtp") -> dict:
    return {"method": alias, "num_speculative_tokens": k}


def run_checked_drafts(ckpt, out, prompts: list[list[int]], **engine_kw) -> tuple[list[int], dict]:
    """(the computed length of each checked draft's sequence, the engine's stats)."""
    cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
    cache: dict = {}

    def weights(name):
        if name not in cache:
            cache[name] = rd.get(name).astype(np.float64)
        return cache[name]

    engine = LLMEngine(out, precision="f32", speculative_config=mtp(2), **engine_kw)
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


def export_notes(ckpt, out, fmt: str) -> list[str]:
    """Exports `ckpt` to `out` (f32 cache) and returns the notes the exporter gave the user."""
    from mla_export.export.exporter import export_model
    from mla_export.export.progress import ExportProgress

    notes: list[str] = []

    class Notes(ExportProgress):
        def note(self, line):
            notes.append(line)

    export_model(ckpt, out, fmt=fmt, kv_dtype="f32", progress=Notes())
    return notes


def llm_greedy_with_and_without_mtp(planted, prompts) -> tuple[list, list, dict]:
    """(plain greedy token ids, with two MTP drafts a step (vLLM's "deepseek_mtp" name), the
    speculating engine's stats), through the offline `LLM` API."""
    from mla_export import LLM

    outs, stats = {}, {}
    for spec in (None, mtp(2, "deepseek_mtp")):
        kw = {} if spec is None else {"speculative_config": spec}
        llm = LLM(model=str(planted), dtype="float32", **kw)
        outs[spec is None] = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], GREEDY)]
        stats = llm.engine.stats()
    return outs[True], outs[False], stats


def serve_spec_metrics(planted, prompt: list[int]) -> dict:
    """`mla-export serve` with three MTP drafts a step: one 24-token greedy completion of
    `prompt`, then the server's metrics (server_helpers.metrics)."""
    import json

    import httpx
    from server_helpers import metrics, start_serve_subprocess

    proc, base = start_serve_subprocess(planted, "--precision", "f32", "--speculative-config", json.dumps(mtp(3)))
    try:
        r = httpx.post(f"{base}/v1/completions", json={
            "model": planted.name, "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 24
        return metrics(base)
    finally:
        proc.terminate()
        proc.communicate(timeout=120)


def assert_draft_inputs_refused(export_dir, tmp_path, drop: str) -> None:
    """A copy of the export whose contract lists the draft without its input `drop` does not load."""
    import json
    import shutil

    import pytest

    from mla_export.formats.contract import load_contract
    from mla_export.formats.contract_error import ContractError

    out = tmp_path / "copy"
    shutil.copytree(export_dir, out)
    raw = json.loads((out / "mla_graph.json").read_text())
    assert drop in [t["name"] for t in raw["mtp"]["inputs"]]
    raw["mtp"]["inputs"] = [t for t in raw["mtp"]["inputs"] if t["name"] != drop]
    (out / "mla_graph.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="mtp.inputs differ"):
        load_contract(out, "none")


def assert_drafts_keep_greedy(out, prompts) -> None:
    """In both runtimes: greedy output with two MTP drafts a step equals plain greedy, and drafts ran."""
    for runtime in RUNTIMES:
        plain, _ = run(out, prompts, runtime=runtime)
        got, stats = run(out, prompts, spec=mtp(2), runtime=runtime)
        assert tokens(got) == tokens(plain)
        assert stats["spec_decode_num_draft_tokens"] > 0
