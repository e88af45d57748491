"""vLLM's conventions on `mla-export serve`: /tokenize, /detokenize, /version in its shapes, and
the `vllm:*` metric names its Grafana dashboards read (produced by prometheus_client)."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import ServerThread, metrics

PRECISION = "f32"


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def server(model_dir):
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(model_dir, precision=PRECISION, max_num_seqs=4, max_num_batched_tokens=128)
    with ServerThread(engine, model_name="tiny", max_num_seqs=4, max_queue=16) as srv:
        yield srv


def post(srv, path, body):
    return httpx.post(f"{srv.base}{path}", json=body, timeout=120)


def test_tokenize_prompt_matches_the_tokenizer(server, model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "The quick brown fox"
    r = post(server, "/tokenize", {"model": "tiny", "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(text).ids and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == server.app.state.server.max_model_len and body["token_strs"] is None
    r = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    body = r.json()
    assert body["tokens"] == tok.encode(text, add_special_tokens=False).ids
    assert body["token_strs"] == tok.encode(text, add_special_tokens=False).tokens


def test_tokenize_chat_is_the_chat_completion_prompt(server, model_dir):
    # The count /tokenize gives for messages is the prompt_tokens /v1/chat/completions reports.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    r = post(server, "/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 2,
                                                 "temperature": 0})
    assert chat.status_code == 200, chat.text
    assert r.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    # transformers' apply_chat_template on the export's own tokenizer files is the oracle.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    assert r.json()["tokens"] == list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                             return_dict=False))


def test_detokenize_round_trip_and_errors(server):
    ids = post(server, "/tokenize", {"prompt": "Once upon a time"}).json()["tokens"]
    r = post(server, "/detokenize", {"model": "tiny", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "<|bos|>Once upon a time"}  # special tokens kept
    for bad, param in [({"tokens": "12"}, "tokens"), ({"tokens": [1, 10**6]}, "tokens"),
                       ({"tokens": [1], "model": "other"}, "model"), ({"prompt": 5}, "prompt")]:
        path = "/tokenize" if "prompt" in bad else "/detokenize"
        r = post(server, path, bad)
        assert r.status_code in (400, 404), (bad, r.text)
        assert r.json()["error"]["param"] == param, r.json()


def test_version(server):
    from mla_export import __version__

    r = httpx.get(f"{server.base}/version", timeout=30)
    assert r.status_code == 200 and r.json() == {"version": __version__}


def test_vllm_metric_names(server):
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 5,
                                         "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    text = httpx.get(f"{server.base}/metrics", timeout=30).text
    mt = metrics(server.base)
    lab = '{model_name="tiny"}'
    # The names vLLM's example Grafana dashboard queries.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"):
        assert name + lab in mt, name
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert f"# TYPE {hist} histogram" in text, hist
        assert mt[f"{hist}_count{lab}"] >= 1, hist
    assert mt["vllm:generation_tokens_total" + lab] >= 5
    assert mt['vllm:request_success_total{finished_reason="length",model_name="tiny"}'] >= 1
    # 5 tokens of one request: 4 gaps between them.
    assert mt["vllm:inter_token_latency_seconds_count" + lab] >= 4
    assert mt["vllm:num_requests_running" + lab] == 0 and mt["vllm:kv_cache_usage_perc" + lab] == 0
