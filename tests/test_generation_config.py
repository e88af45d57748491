"""vLLM's --generation-config: a model's generation_config.json sampling values (temperature,
top_p, top_k, min_p, repetition_penalty, max_new_tokens) are the defaults of requests that do not
give them, in LLM.generate and in the server; "vllm" ignores them; a directory reads its own file;
a malformed file is refused at start-up naming the file and key (tiny export, f32)."""

from __future__ import annotations

import json
import shutil

import pytest

from server_helpers import ServerThread


@pytest.fixture(scope="module")
def recommended(exports, tmp_path_factory):
    """The tiny export with a generation_config.json recommending greedy decoding and 7 tokens."""
    out = tmp_path_factory.mktemp("gencfg") / "tiny"
    shutil.copytree(exports.tiny(), out)
    cfg = json.loads((out / "generation_config.json").read_text())
    cfg.update(temperature=0.0, top_p=0.9, top_k=5, repetition_penalty=1.2, max_new_tokens=7)
    (out / "generation_config.json").write_text(json.dumps(cfg))
    return out


def test_llm_applies_the_models_defaults(recommended, tmp_path):
    from mla_export import LLM, SamplingParams

    llm = LLM(model=str(recommended), dtype="float32")
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty, d.max_tokens) == (0.0, 0.9, 5, 1.2, 7)
    out = llm.generate("Hello")[0].outputs[0]
    want = llm.generate("Hello", SamplingParams(temperature=0.0, top_p=0.9, top_k=5, repetition_penalty=1.2,
                                                max_tokens=7))[0].outputs[0]
    assert out.token_ids == want.token_ids
    plain = LLM(engine=llm.engine, generation_config="vllm").get_default_sampling_params()
    assert (plain.temperature, plain.max_tokens) == (1.0, 16)
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    assert LLM(engine=llm.engine, generation_config=str(other)).get_default_sampling_params().temperature == 0.3


@pytest.mark.parametrize("content, message", [("{", "not valid JSON"), ('{"top_k": 2.5}', "top_k"),
                                              ('{"temperature": "hot"}', "temperature"), ("[1]", "object")])
def test_a_bad_generation_config_is_refused_naming_it(recommended, tmp_path, content, message):
    from mla_export import LLM
    from mla_export.server.app import create_app

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "generation_config.json").write_text(content)
    llm = LLM(model=str(recommended), dtype="float32", generation_config="vllm")
    with pytest.raises(ValueError, match=message):
        LLM(engine=llm.engine, generation_config=str(bad))
    with pytest.raises(ValueError, match=message):
        create_app(llm.engine, model_name="t", generation_config=str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        create_app(llm.engine, model_name="t", generation_config=str(tmp_path / "missing"))


@pytest.mark.parametrize("source", ["auto", "vllm"])
def test_server_applies_the_models_defaults(recommended, source):
    import openai

    from mla_export import LLM, SamplingParams
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(recommended, precision="f32", num_blocks=64)
    offline = LLM(model=str(recommended), dtype="float32")
    with ServerThread(engine, model_name="t", generation_config=source) as srv:
        c = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="x")
        r = c.completions.create(model="t", prompt="Hello", extra_body=dict(ignore_eos=True, return_token_ids=True))
        ids = r.choices[0].model_extra["token_ids"]
        if source == "auto":  # greedy with the model's filters, 7 tokens
            want = offline.generate("Hello", SamplingParams(temperature=0.0, top_p=0.9, top_k=5, repetition_penalty=1.2,
                                                            max_tokens=7, ignore_eos=True))[0].outputs[0]
            assert ids == want.token_ids
            # a request's own values win
            r = c.completions.create(model="t", prompt="Hello", max_tokens=3, temperature=0.0,
                                     extra_body=dict(repetition_penalty=1.0, top_k=-1, ignore_eos=True))
            assert r.usage.completion_tokens == 3
        else:  # SamplingParams' own defaults: 16 tokens
            assert len(ids) == 16
