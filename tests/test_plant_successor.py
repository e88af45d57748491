"""tools/plant_successor.py: the benchmark checkpoint whose greedy text repeats its prompt (the
n-gram speculation figure of docs/BENCHMARKS.md is measured on it). f32, a tiny random DeepSeek-V3
checkpoint made by transformers: the planted copy's greedy continuation of each planted prompt
follows the prompt's cycle, and n-gram drafts are accepted on it (with the source checkpoint they
are not: random weights do not repeat themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _export(ckpt: Path, out: Path) -> Path:
    from mla_export.cli import main

    assert main(["export", str(ckpt), "-o", str(out), "-q"]) == 0
    return out


def _run(export: Path, prompts: list, spec: dict | None) -> tuple[list, dict]:
    from mla_export.runtime import LLMEngine, SamplingParams

    engine = LLMEngine(export, precision="f32", enable_prefix_caching=False, speculative_config=spec)
    outs = {}
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [outs[str(i)] for i in range(len(prompts))], engine.stats()


@pytest.fixture(scope="module")
def planted(exports, tmp_path_factory):
    src = exports.checkpoint("deepseek_v3")
    out = tmp_path_factory.mktemp("succ") / "ckpt"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "plant_successor.py"), str(src), str(out),
                           "--cycle", "16", "--num-prompts", "3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return src, out


def test_greedy_text_follows_the_planted_cycles_and_ngram_drafts_are_accepted(planted, tmp_path):
    src, ckpt = planted
    prompts = json.loads((ckpt / "prompts.json").read_text())
    assert json.loads((ckpt / "mla_checkpoint.json").read_text())["planted"] == "successor"
    export = _export(ckpt, tmp_path / "planted")
    outs, _ = _run(export, prompts, None)
    for p, got in zip(prompts, outs):
        cycle = p[:len(p) // 3]
        want = [cycle[(len(p) + i) % len(cycle)] for i in range(len(got))]
        assert got == want
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    spec_outs, stats = _run(export, prompts, spec)
    assert spec_outs == outs
    assert stats["spec_decode_num_accepted_tokens"] >= 0.9 * stats["spec_decode_num_draft_tokens"] > 0
    # the source checkpoint, the same prompts: its greedy text is not the cycle, drafts mostly fail
    src_outs, src_stats = _run(_export(src, tmp_path / "source"), prompts, spec)
    assert src_outs != outs
    assert src_stats["spec_decode_num_accepted_tokens"] < 0.5 * max(src_stats["spec_decode_num_draft_tokens"], 1)


def test_refuses_what_it_cannot_plant(planted, tmp_path):
    src, _ = planted
    tool = str(REPO / "tools" / "plant_successor.py")
    for argv, says in [([str(tmp_path / "none"), str(tmp_path / "o1")], "no config.json"),
                       ([str(src), str(tmp_path / "o2"), "--cycle", "1"], "--cycle >= 2"),
                       ([str(src), str(src)], "exists")]:
        proc = subprocess.run([sys.executable, tool, *argv], capture_output=True, text=True)
        assert proc.returncode != 0 and says in proc.stderr, (argv, proc.stderr)
