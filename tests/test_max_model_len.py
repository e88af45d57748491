"""max_model_len (engine, LLM, `generate`, `serve`): by default what both the model and the KV
cache hold, so a request without max_tokens gets the room left instead of a 400 whenever the
cache is smaller than max_position_embeddings. Tiny f32 export, block size 4."""

from __future__ import annotations

import json

import httpx
import pytest

from mla_export.runtime import LLM, LLMEngine
from server_helpers import ServerThread

BS = 4


@pytest.fixture(scope="module")
def out_dir(exports):
    return exports.model("deepseek_v3", "f32", BS)[1]


def test_default_is_what_the_cache_holds(out_dir):
    engine = LLMEngine(out_dir, precision="f32", num_blocks=4)
    assert engine.facts.max_model_len > 16 and engine.max_model_len == 4 * BS


def test_given_max_model_len_is_checked(out_dir):
    with pytest.raises(ValueError, match="more than the model's context"):
        LLMEngine(out_dir, precision="f32", max_model_len=10**6)
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        LLMEngine(out_dir, precision="f32", num_blocks=2, max_model_len=12)
    with pytest.raises(ValueError, match="positive integer"):
        LLMEngine(out_dir, precision="f32", max_model_len=0)


def test_llm_honours_max_model_len(out_dir):
    llm = LLM(out_dir, precision="f32", max_model_len=8)
    out = llm.generate([1, 2, 3], max_tokens=100, ignore_eos=True, temperature=0.0)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_generate_cli_flag(out_dir, capsys):
    from mla_export.cli import main

    code = main(["generate", str(out_dir), "--prompt-ids", "1,2,3", "--max-tokens", "50", "--max-model-len", "8",
                 "--precision", "f32", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) <= 5


def test_server_caps_an_omitted_max_tokens_to_the_room_left(out_dir):
    engine = LLMEngine(out_dir, precision="f32", num_blocks=4, max_num_seqs=2)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with ServerThread(engine, model_name="tiny", max_num_seqs=2, max_queue=4, chat_template=template) as srv:
        # Chat without max_tokens: up to the context, which is the 16 tokens the cache holds
        # (before: 400, since room was counted against max_position_embeddings).
        r = httpx.post(srv.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 4 * BS
        card = httpx.get(srv.base + "/v1/models", timeout=30).json()["data"][0]
        assert card["max_model_len"] == 4 * BS
