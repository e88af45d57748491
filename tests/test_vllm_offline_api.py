"""vLLM's offline-inference quickstart and examples run with only the import line changed
(`from vllm import LLM, SamplingParams` -> `from mla_export import LLM, SamplingParams`), on the
tiny export (random weights: the text is noise; the shapes, counts and rules are what is checked)."""

from __future__ import annotations

import pytest

from mla_export import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(exports):
    return LLM(model=str(exports.tiny()), dtype="float32")


def test_quickstart(llm):
    # vLLM's docs/getting_started/quickstart.md, offline batched inference, verbatim but the import
    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
    assert [o.prompt for o in outputs] == prompts
    assert all(len(o.outputs) == 1 and 1 <= len(o.outputs[0].token_ids) <= 16 for o in outputs)
    assert all(o.outputs[0].finish_reason in ("stop", "length") for o in outputs)


def test_n_seed_logprobs_and_stop_strings(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, logprobs=2)
    (out,) = llm.generate("The capital of France is", params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # three different draws
    again = llm.generate("The capital of France is", params)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]  # seeded
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids)
        assert c.cumulative_logprob == pytest.approx(sum(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)))
    # a stop string taken from a free-running output ends the next run there
    free = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    stop = free.text[6:9]
    assert len(stop) == 3
    cut = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    c = cut.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert c.text == free.text[:free.text.index(stop)]
    kept = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=stop,
                                                include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == free.text[:free.text.index(stop) + len(stop)]


def test_prompt_forms_and_defaults(llm):
    ids = llm.get_tokenizer().encode("The future of AI is").ids
    a = llm.generate({"prompt": "The future of AI is"}, SamplingParams(temperature=0.0, max_tokens=5))[0]
    b = llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0.0, max_tokens=5))[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids and b.prompt is None
    # no sampling params: SamplingParams() over the export's generation_config.json (vLLM's "auto")
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.max_tokens) == (1.0, 16)
    with pytest.raises(ValueError, match="not both"):
        llm.generate("x", SamplingParams(), max_tokens=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_parallel_size=2), "tensor_parallel_size"),
    (dict(dtype="float16"), "dtype"),
    (dict(gpu_memory_utilization=0.9), "gpu_memory_utilization"),
    (dict(tokenizer="/elsewhere"), "tokenizer"),
])
def test_vllm_arguments_that_cannot_apply_are_refused(exports, kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        LLM(model=str(exports.tiny()), **kwargs)
