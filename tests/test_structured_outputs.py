"""Structured outputs (llguidance): JSON schemas, regexes, choices and grammars, in the engine
(`SamplingParams(structured_outputs=...)`) and through the server with the official `openai` client.

f32 tiny export with random weights: the model's own preference is noise, so an output that
parses and validates does so because of the grammar. Schemas are bounded (maxLength, maxItems,
integer ranges, additionalProperties false) so the tiny model finishes them in a few dozen tokens;
JSON whitespace is turned off (disable_any_whitespace) where the model would otherwise spend its
tokens on it (vLLM's default keeps JSON whitespace flexible, as here).
"""

from __future__ import annotations

import json
import pickle
import re

import httpx
import jsonschema
import openai
import pytest

from mla_export import LLM, SamplingParams
from mla_export.runtime import LLMEngine
from mla_export.runtime.sampling import GuidedDecodingParams, StructuredOutputsParams
from server_helpers import ServerThread, openai_client

PRECISION = "f32"
MAX_TOKENS = 80  # more than any of the schemas below takes on the tiny model


def obj(props: dict, required: list | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def integer(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


SCHEMAS = [
    obj({"name": {"type": "string", "maxLength": 6}, "age": integer(0, 120)}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    {"type": "boolean"},
    integer(-50, 50),
    obj({"price": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25},
         "qty": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10}}),
    {"type": "array", "items": integer(0, 9), "minItems": 2, "maxItems": 4},
    obj({"user": obj({"id": integer(1, 999), "admin": {"type": "boolean"}})}),
    obj({"version": {"const": "v1"}, "n": integer(0, 3)}),
    obj({"a": integer(0, 5), "b": {"type": "boolean"}, "c": {"type": "string", "maxLength": 3}}, required=["a"]),
    obj({"x": {"type": "null"}, "ok": {"type": "boolean"}}),
    {"anyOf": [integer(0, 9), {"type": "boolean"}]},
    {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
    {"type": "array", "items": obj({"k": {"enum": ["a", "b"]}, "v": integer(0, 99)}), "minItems": 1, "maxItems": 2},
    {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
    {"enum": [1, "two", 3.5, None, True]},
    {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
     "minItems": 1, "maxItems": 2},
    {"$defs": {"pt": obj({"x": integer(0, 9), "y": integer(0, 9)})},
     **obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    obj({"code": {"type": "string", "minLength": 2, "maxLength": 4},
         "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3}}),
    {"oneOf": [obj({"kind": {"const": "circle"}, "r": integer(1, 9)}),
               obj({"kind": {"const": "square"}, "side": integer(1, 9)})]},
    obj({"day": {"type": "string", "format": "date"}, "level": {"enum": ["low", "high"]}}),
]
PROMPTS = ["Hello", "The capital of France is", "Numbers too: 0 1 2 3", "def add(a, b):"]


def check_json(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def so_json(schema, **kw) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=schema, disable_any_whitespace=True, **kw)


@pytest.fixture(scope="module")
def llm(exports):
    return LLM(model=str(exports.tiny()), dtype="float32")


# ---- engine ----------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_json_schemas(llm, temperature):
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=MAX_TOKENS, structured_outputs=so_json(s))
              for i, s in enumerate(SCHEMAS)]
    outs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(SCHEMAS))], params)  # one batch
    for schema, out in zip(SCHEMAS, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason is None, (schema, c.text)
        assert len(c.token_ids) < MAX_TOKENS
        check_json(c.text, schema)


def test_without_the_grammar_the_output_is_not_json(llm):
    """The premise of these tests: the random model does not write JSON by itself."""
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24))
    for o in outs:
        with pytest.raises(ValueError):
            json.loads(o.outputs[0].text)


def test_flexible_whitespace_and_additional_properties_options(llm):
    schema = {"type": "object", "properties": {"a": integer(0, 9)}, "required": ["a"]}  # extra keys allowed
    (out,) = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=so_json(
        schema, disable_additional_properties=True)))
    assert json.loads(out.outputs[0].text).keys() == {"a"}
    flexible = StructuredOutputsParams(json=obj({"a": integer(0, 9)}))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=1.0, seed=3, max_tokens=200, structured_outputs=flexible))
    assert any(o.outputs[0].finish_reason == "stop" for o in outs)
    for o in outs:
        c = o.outputs[0]
        if c.finish_reason == "stop":
            check_json(c.text, obj({"a": integer(0, 9)}))
        assert c.text.lstrip()[:1] == "{"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_regex_choice_and_grammars(llm, temperature):
    regexes = [r"[a-z]{3}-[0-9]{2}", r"(cat|dog)s?", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[A-Z][a-z]{0,5}",
               r"[a-z]{1,5}@[a-z]{1,5}\.(com|org)"]
    choices = ["yes", "no", "maybe so"]
    lark = 'start: "(" NUM ("," NUM){0,3} ")"\nNUM: /[0-9]{1,3}/'
    gbnf = 'root ::= ("up" | "down") " " [0-9]'
    cases = [(StructuredOutputsParams(regex=r), lambda t, r=r: re.fullmatch(r, t)) for r in regexes]
    cases += [(StructuredOutputsParams(choice=choices), lambda t: t in choices)] * 4
    cases += [(StructuredOutputsParams(grammar=lark), lambda t: re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3}){0,3}\)", t)),
              (StructuredOutputsParams(grammar=gbnf), lambda t: re.fullmatch(r"(up|down) [0-9]", t))]
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=MAX_TOKENS, structured_outputs=so)
              for i, (so, _) in enumerate(cases)]
    outs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(cases))], params)
    for (so, ok), out in zip(cases, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and ok(c.text), (so, c.text)


def test_choice_draws_among_the_choices(llm):
    choices = ["yes", "no", "maybe so"]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=8, structured_outputs=StructuredOutputsParams(
        choice=choices)) for s in range(24)]
    texts = [o.outputs[0].text for o in llm.generate(["Hello"] * 24, params)]
    assert set(texts) <= set(choices) and len(set(texts)) >= 2, texts


def test_json_object(llm):
    so = StructuredOutputsParams(json_object=True, disable_any_whitespace=True)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=so))
    for o in outs:
        c = o.outputs[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:  # an open object the model kept writing: a truncated object, as vLLM returns it
            assert c.finish_reason == "length" and c.text.startswith("{")
    assert any(o.outputs[0].finish_reason == "stop" for o in outs)


def test_max_tokens_before_the_grammar_completes_truncates(llm):
    schema = SCHEMAS[6]
    full = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                structured_outputs=so_json(schema)))[0].outputs[0]
    assert full.finish_reason == "stop" and len(full.token_ids) > 6
    cut = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=6,
                                               structured_outputs=so_json(schema)))[0].outputs[0]
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:6]
    assert full.text.startswith(cut.text)
    with pytest.raises(ValueError):
        json.loads(cut.text)


def test_unconstrained_request_in_the_batch_is_unchanged(llm):
    plain = SamplingParams(temperature=0.0, max_tokens=20)
    alone = llm.generate(PROMPTS[1], plain)[0].outputs[0]
    constrained = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=so_json(s))
                   for s in SCHEMAS[:3]]
    outs = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]], [constrained[0], plain, *constrained[1:]])
    assert outs[1].outputs[0].token_ids == alone.token_ids and outs[1].outputs[0].text == alone.text
    for o, s in zip([outs[0], outs[2], outs[3]], SCHEMAS[:3]):
        check_json(o.outputs[0].text, s)


def test_n_completions_each_follow_the_grammar(llm):
    (out,) = llm.generate("Hello", SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=MAX_TOKENS,
                                                  structured_outputs=so_json(SCHEMAS[0])))
    assert len(out.outputs) == 4 and len({c.text for c in out.outputs}) > 1
    for c in out.outputs:
        check_json(c.text, SCHEMAS[0])


def test_preemption_and_prefix_caching_keep_the_grammar(exports):
    """Six blocks of 16 rows for four requests of up to ~45 rows: requests are preempted and
    recomputed mid-output; the matcher follows their tokens and the outputs equal a roomy run."""
    tiny = exports.tiny()
    schemas = [SCHEMAS[6], SCHEMAS[16], SCHEMAS[19], SCHEMAS[0]]
    params = [SamplingParams(temperature=t, seed=i, max_tokens=MAX_TOKENS - 30, structured_outputs=so_json(s))
              for i, (s, t) in enumerate(zip(schemas, [0.0, 1.0, 0.0, 1.0]))]
    roomy = LLM(engine=LLMEngine(tiny, precision=PRECISION)).generate(PROMPTS, params)
    tight_engine = LLMEngine(tiny, precision=PRECISION, num_blocks=6, max_num_seqs=4)
    tight = LLM(engine=tight_engine).generate(PROMPTS, params)
    assert tight_engine.stats()["num_preemptions"] > 0
    for a, b, s in zip(roomy, tight, schemas):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        check_json(b.outputs[0].text, s)
    # The same long prompt again: its blocks come from the prefix cache, the output is the same.
    long_prompt = "A paged cache keeps the keys and values of every sequence in fixed-size blocks, and"
    first = LLM(engine=tight_engine).generate(long_prompt, params[0])[0]
    again = LLM(engine=tight_engine).generate(long_prompt, params[0])[0]
    assert again.metrics.num_cached_prompt_tokens > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    check_json(again.outputs[0].text, schemas[0])


def test_logprobs_are_those_of_the_masked_row(llm):
    """vLLM applies the grammar bitmask before the sampler: the top logprobs are allowed tokens."""
    so = StructuredOutputsParams(choice=["yes", "no"])
    (out,) = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, structured_outputs=so))
    c = out.outputs[0]
    assert c.text in ("yes", "no")
    first = c.logprobs[0]
    assert first[c.token_ids[0]].logprob > float("-inf")
    for lp in first.values():  # a token outside the grammar has probability 0 (-inf), the others start a choice
        assert lp.logprob == float("-inf") or any(w.startswith(lp.decoded_token) for w in ("yes", "no")), first


@pytest.mark.parametrize("so, field", [
    (dict(json={"type": "frob"}), "structured_outputs.json"),
    (dict(json="{not json"), "structured_outputs.json"),
    (dict(json={"type": "array", "minItems": 3, "maxItems": 1}), "structured_outputs.json"),
    (dict(regex="a(b"), "structured_outputs.regex"),
    (dict(grammar="start: foo"), "structured_outputs.grammar"),
    (dict(choice=[]), "structured_outputs.choice"),
    (dict(choice="yes"), "structured_outputs.choice"),
    (dict(json={}, regex="a"), "exactly one"),
    (dict(), "exactly one"),
    (dict(json={}, structural_tag="{}"), "structured_outputs.structural_tag"),
])
def test_bad_specs_fail_at_add_request_naming_the_field(llm, so, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        p = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**so))
        llm.engine.add_request("bad", "Hello", p)
    assert not llm.engine.has_unfinished_requests()


def test_vllm_spellings(llm):
    """SamplingParams(guided_decoding=GuidedDecodingParams(...)) (vLLM's older API) and a dict."""
    old = SamplingParams(temperature=0.0, max_tokens=8, guided_decoding=GuidedDecodingParams(choice=["a1", "b2"],
                                                                                             backend="guidance"))
    as_dict = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs={"choice": ["a1", "b2"]})
    assert old.structured_outputs.choice == as_dict.structured_outputs.choice == ("a1", "b2")
    a, b = llm.generate(["Hello", "Hello"], [old, as_dict])
    assert a.outputs[0].text == b.outputs[0].text in ("a1", "b2")
    with pytest.raises(ValueError, match="backend"):
        GuidedDecodingParams(regex="a", backend="xgrammar")
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       guided_decoding=GuidedDecodingParams(regex="b"))
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"jsn": {}})


def test_eos_only_where_the_grammar_accepts(llm):
    """The bitmask itself: end-of-sequence is allowed exactly when the text so far is a full match."""
    import numpy as np

    eng = llm.engine
    (eos,) = eng.facts.eos_token_ids  # the tiny export has one
    g = eng.structured.grammar(StructuredOutputsParams(regex="ab(cd)?"))
    tok = eng.tokenizer
    zeros = np.zeros((1, eng.facts.vocab_size), np.float32)

    def allowed(out_ids):
        return np.isfinite(eng.structured.mask(zeros, [g], [out_ids])[0])

    def ids(text):
        return tok.encode(text, add_special_tokens=False).ids

    assert not allowed([])[eos]
    ab = ids("ab")
    row = allowed(ab)
    assert row[eos] and row[ids("c")[0]] and not row[ids("a")[0]]  # "ab" is a match that may grow into "abcd"
    assert not allowed(ab + ids("c"))[eos]
    assert g.num_consumed == len(ab) + 1
    assert allowed(ab)[eos] and g.num_consumed == len(ab)  # rolled back to the tokens it is given
    assert not g.finished
    assert all(g.accept(t) for t in ids("cd"))
    assert g.finished  # nothing can follow "abcd"
    assert np.flatnonzero(allowed(ab + ids("cd"))).tolist() == [eos]


def test_params_cross_a_process_boundary(llm):
    """Ray Serve pickles the SeqRequest (its SamplingParams included) to the replica, which
    compiles the grammar in its own engine: the spec must survive the trip unchanged."""
    p = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, n=1, structured_outputs=so_json(SCHEMAS[16]))
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.structured_outputs.key() == p.structured_outputs.key()
    a, b = llm.generate(["Hello", "Hello"], [p, q])
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    check_json(b.outputs[0].text, SCHEMAS[16])


# ---- server ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(exports):
    engine = LLMEngine(exports.tiny(), precision=PRECISION, max_num_seqs=8, max_num_batched_tokens=128)
    srv = ServerThread(engine, model_name="tiny", max_num_seqs=8, max_queue=64)
    with srv:
        yield srv
    final = srv.app.state.server.final_stats
    assert final["kv_blocks_used"] == 0 and final["num_running"] == 0


client = openai_client


NO_WHITESPACE = {"structured_outputs": {"disable_any_whitespace": True}}  # joins response_format, as in vLLM


def test_chat_response_format_json_schema(server):
    c = client(server)
    for i, schema in enumerate(SCHEMAS):
        rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        msgs = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        r = c.chat.completions.create(model="tiny", messages=msgs, response_format=rf, temperature=0,
                                      max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (schema, text)
        check_json(text, schema)
        stream = c.chat.completions.create(model="tiny", messages=msgs, response_format=rf, temperature=0,
                                           max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE, stream=True)
        parts, reason = [], None
        for chunk in stream:
            for ch in chunk.choices:
                parts.append(ch.delta.content or "")
                reason = ch.finish_reason or reason
        assert "".join(parts) == text and reason == "stop"


def test_guided_choice_regex_grammar_and_json_object(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Classify: wonderful!"}]
    for seed in range(4):
        r = c.chat.completions.create(model="tiny", messages=msgs, temperature=1.0, seed=seed, max_tokens=10,
                                      extra_body={"guided_choice": ["positive", "negative"]})
        assert r.choices[0].message.content in ("positive", "negative")
    r = c.completions.create(model="tiny", prompt="Code:", max_tokens=20, temperature=0,
                             extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"})
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = c.completions.create(model="tiny", prompt="Go", max_tokens=20, temperature=0, n=3, seed=1,
                             extra_body={"structured_outputs": {"grammar": 'start: ("up" | "down") " " /[0-9]/'}})
    assert all(re.fullmatch("(up|down) [0-9]", ch.text) for ch in r.choices)
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=MAX_TOKENS, temperature=0,
                             extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                 "name": "x", "schema": SCHEMAS[1]}}, "guided_decoding_backend": "guidance",
                                 **NO_WHITESPACE})
    check_json(r.choices[0].text, SCHEMAS[1])
    r = c.chat.completions.create(model="tiny", messages=msgs, response_format={"type": "json_object"},
                                  temperature=0, max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    ch = r.choices[0]
    if ch.finish_reason == "stop":
        assert isinstance(json.loads(ch.message.content), dict)
    else:
        assert ch.finish_reason == "length" and ch.message.content.startswith("{")


def test_truncated_output_is_returned_with_finish_reason_length(server):
    rf = {"type": "json_schema", "json_schema": {"name": "u", "schema": SCHEMAS[6]}}
    r = client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                               response_format=rf, temperature=0, max_tokens=5)
    ch = r.choices[0]
    assert ch.finish_reason == "length" and ch.message.content.startswith("{") and r.usage.completion_tokens == 5


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": "json"}, "response_format"),
    ({"guided_json": {"type": "array", "minItems": 3, "maxItems": 1}}, "guided_json"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_grammar": "start: foo"}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ({"structured_outputs": {"regex": "a", "structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regx": "a"}}, "structured_outputs.regx"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format"),
]


@pytest.mark.parametrize("extra, param", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_structured_output_requests_are_400(server, extra, param):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/v1/completions", {"prompt": "x"})):
        r = httpx.post(f"{server.base}{path}", json={**body, "max_tokens": 4, **extra}, timeout=60)
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (path, err)
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=4, extra_body=extra)
