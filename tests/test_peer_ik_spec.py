"""tools/peers/ik_ngram_spec.py reads ik_llama.cpp's llama-server timings from its log (its JSON reply
fails on random vocabularies' bytes): the request's lines only, the decode line and not the prompt's,
the draft counts when speculating; a log without them stops the run instead of a made-up figure.
The lines are the server's own (a Zen 4 run, 2026-12-06). No server is started here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ik_ngram_spec", ROOT / "tools/peers/ik_ngram_spec.py")
ik = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ik)

EARLIER = """prompt eval time =     250.00 ms /   192 tokens (    1.30 ms per token,   768.00 tokens per second)
       eval time =     900.00 ms /    64 tokens (   14.06 ms per token,    71.11 tokens per second)
draft acceptance rate = 0.50000 (   10 accepted /    20 generated)
"""
REQUEST = """INFO [           release_slots] slot released | id_slot=0 id_task=2 n_ctx=4096 n_past=256
slot print_timing: id  0 | task 2 | 
prompt eval time =     203.42 ms /   192 tokens (    1.06 ms per token,   943.86 tokens per second)
       eval time =     459.30 ms /    64 tokens (    7.18 ms per token,   139.34 tokens per second)
      total time =     662.72 ms /   256 tokens
draft acceptance rate = 1.00000 (   47 accepted /    47 generated)
"""


def test_reads_this_requests_decode_line_and_drafts(tmp_path):
    log = tmp_path / "ik.log"
    log.write_text(EARLIER + REQUEST)
    t = ik._timings(log, len(EARLIER.encode()))
    assert t == {"tok_s": pytest.approx(64 / 0.45930), "n": 64, "drafted": 47, "accepted": 47}


def test_plain_server_has_no_drafts(tmp_path):
    log = tmp_path / "ik.log"
    plain = REQUEST.replace("draft acceptance rate = 1.00000 (   47 accepted /    47 generated)\n", "")
    log.write_text(plain)
    assert ik._timings(log, 0)["drafted"] == 0


def test_no_timing_line_stops_the_run(tmp_path):
    log = tmp_path / "ik.log"
    log.write_text(EARLIER + "INFO slot released\n")
    with pytest.raises(SystemExit, match="no 'eval time' line"):
        ik._timings(log, len(EARLIER.encode()))


def test_bad_prompts_file_is_refused(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('[["a"]]')
    exe = tmp_path / "srv"
    exe.write_text("")
    with pytest.raises(SystemExit):
        ik.main(["--server", str(exe), "--gguf", str(exe), "--prompts", str(bad)])
    assert "--prompts must be a JSON list" in capsys.readouterr().err
