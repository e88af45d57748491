"""Fast unit tests of the server's pure parts: request parsing, incremental text with stop
strings, the Prometheus text, size parsing. (The live server is in test_server.py.)"""

from __future__ import annotations

import argparse

import pytest

from mla_export.cli.commands.serve import parse_size
from mla_export.server import protocol as P
from mla_export.server.app import _Choice, _Detok
from mla_export.runtime.chat_template import ChatTemplate, TemplateError, load_chat_template
from mla_export.server.metrics import ServerMetrics, parse_prometheus_text


def test_completion_prompt_forms():
    assert P.parse_completion_request({"prompt": "hi"}).prompts == ["hi"]
    assert P.parse_completion_request({"prompt": [1, 2]}).prompts == [[1, 2]]
    assert P.parse_completion_request({"prompt": ["a", "b"]}).prompts == ["a", "b"]
    assert P.parse_completion_request({"prompt": [[1], [2, 3]]}).prompts == [[1], [2, 3]]
    r = P.parse_completion_request({"prompt": "x", "max_tokens": 3.0, "stop": ["a", 7], "seed": -1,
                                    "unknown_field": {"ignored": True}})
    s = r.sampling
    assert (s.max_tokens, s.stop, s.stop_token_ids, s.n) == (3, ["a"], [7], 1)
    assert s.seed == 2**63 - 1  # negative seeds map deterministically into numpy's range
    assert P.parse_chat_request({"messages": [{"role": "user", "content": "x"}]}).sampling.max_tokens is None


@pytest.mark.parametrize("body,param", [
    ({"prompt": True}, "prompt"),
    ({"prompt": [[1], "a"]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "stop": [None]}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-3]}, "stop_token_ids"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": "x", "logit_bias": {"a": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1": 500}}, "logit_bias"),
    ({"prompt": "x", "structured_outputs": {"json": {"type": "frob"}}}, "structured_outputs.json"),
    ({"prompt": "x", "structured_outputs": "json"}, "structured_outputs"),
    ({"prompt": "x", "model": 5}, "model"),
])
def test_completion_errors_name_the_parameter(body, param):
    with pytest.raises(P.APIError) as e:
        P.parse_completion_request(body)
    assert e.value.status == 400 and e.value.param == param
    b = e.value.body()["error"]
    assert b["type"] == "invalid_request_error" and b["param"] == param and b["message"]


@pytest.mark.parametrize("raw", [b"", b"{", b"null", b"\xff\xfe", b'"text"'])
def test_malformed_json(raw):
    with pytest.raises(P.APIError) as e:
        P.parse_json_body(raw)
    assert e.value.status == 400


def test_chat_messages():
    r = P.parse_chat_request({"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                       {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}], "max_completion_tokens": 5})
    assert r.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "ab"},
                          {"role": "assistant", "content": ""}]
    assert r.sampling.max_tokens == 5
    for bad in ([{"role": "user"}], [{"role": "user", "content": [{"type": "image_url"}]}], [3]):
        with pytest.raises(P.APIError):
            P.parse_chat_request({"messages": bad})
    with pytest.raises(P.APIError):
        P.parse_chat_request({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})


def _delta(new_text, finished=False, n=1, text=None):
    from mla_export.server.deltas import Delta

    return Delta("r", [n - 1], new_text, finished, "length" if finished else None, text=text)


def test_detok_emits_only_the_new_text_and_the_final_decode():
    # The engine's deltas (already cut at stop strings, engine-side): each step emits its new part.
    d = _Detok(None)
    ch = _Choice(index=0, request_id="r", stop=[])
    emitted = []
    for i, t in enumerate(["ab", "", "EN", "xyé"]):
        delta = d.advance(ch, _delta(t, n=i + 1))
        ch.add_text(delta)
        emitted.append(delta)
    assert emitted == ["ab", "", "EN", "xyé"] and ch.final_text is None and ch.text == "abENxyé"
    # The finishing delta carries the final decode; text already sent is never taken back.
    delta = d.advance(ch, _delta("!", finished=True, n=5, text="abENxyé!"))
    assert delta == "!" and ch.final_text == "abENxyé!"
    ch2 = _Choice(index=0, request_id="r", stop=[])
    ch2.text = "abX"
    assert d.advance(ch2, _delta("Z", finished=True, n=3, text="abYZ")) == "Z" and ch2.final_text == "abYZ"


def test_metrics_text():
    m = ServerMetrics()
    m.observe_ttft(0.02)
    m.observe_ttft(3.0)
    m.observe_end("length", 1.0, 10, 5)
    m.observe_end("abort", None, 3)
    m.observe_rejected("queue_full")
    m.observe_step(0.0, 4)
    text = m.render({"num_running": 2, "num_waiting": 1, "kv_blocks_total": 10, "kv_blocks_used": 4,
                     "kv_blocks_free": 6, "prefix_cache_queries": 8, "prefix_cache_hits": 2},
                    model='we"ird', healthy=True)
    v = parse_prometheus_text(text)
    lab = 'model="we\\"ird"'
    assert v[f"mla_num_requests_running{{{lab}}}"] == 2
    assert v[f"mla_kv_cache_usage_ratio{{{lab}}}"] == 0.4
    assert v[f"mla_prefix_cache_hit_rate{{{lab}}}"] == 0.25
    assert v[f'mla_request_finished_total{{finish_reason="abort",{lab}}}'] == 1
    assert v[f'mla_request_rejected_total{{{lab},reason="queue_full"}}'] == 1
    assert v['mla_time_to_first_token_seconds_bucket{le="0.025"}'] == 1
    assert v['mla_time_to_first_token_seconds_bucket{le="+Inf"}'] == 2
    assert v["mla_time_to_first_token_seconds_count"] == 2
    assert v[f"mla_prompt_tokens_total{{{lab}}}"] == 5
    # Every sample has HELP and TYPE lines.
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    for key in v:
        base = key.split("{")[0]
        assert any(base == n or base.startswith(n + "_") for n in names), key


def test_chat_template_sandbox_and_loading(tmp_path):
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"
                     "{% if add_generation_prompt %}assistant:{% endif %}", bos_token="<s>")
    assert t.render([{"role": "user", "content": "hi"}]) == "<s>user:hi|assistant:"
    with pytest.raises(TemplateError):
        ChatTemplate("{{ raise_exception('no system role') }}").render([])
    with pytest.raises(TemplateError):  # the sandbox refuses attribute games
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    (tmp_path / "t.jinja").write_text("X{{ messages|length }}")
    assert load_chat_template(tmp_path, None, tmp_path / "t.jinja") == "X{{ messages|length }}"
    assert load_chat_template(tmp_path, "{{ 1 }}") == "{{ 1 }}"
    assert load_chat_template(tmp_path, None) is None
    with pytest.raises(FileNotFoundError):
        load_chat_template(tmp_path, None, tmp_path / "missing.jinja")


def test_parse_size():
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512 MiB") == 512 << 20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("", "-1G", "2XB", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
