"""`LLM.generate`'s prompts argument (issue 36, cause 8): vLLM's forms are taken (a string,
TextPrompt / TokensPrompt dicts, lists of those) and anything else is refused naming `prompts`
and the bad entry; a set's elements, bytes or a generator's items are no prompts. Tiny preset, f32."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def llm(exports):
    from mla_export import LLM

    return LLM(exports.tiny(), dtype="float32", num_blocks=32)


def _ids(llm, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, max_tokens=2, temperature=0.0)]


class TestPromptsArgument:
    def test_vllm_forms_are_taken(self, llm):
        ids = llm.tokenizer.encode("Hello there").ids
        want = _ids(llm, "Hello there")[0]
        for prompts in ("Hello there", ["Hello there"], ("Hello there",), {"prompt": "Hello there"},
                        [{"prompt": "Hello there"}], {"prompt_token_ids": ids}, [{"prompt_token_ids": ids}],
                        ids, [ids], [{"prompt": "Hello there"}, {"prompt_token_ids": ids}, "Hello there", ids]):
            got = _ids(llm, prompts)
            assert got and all(g == want for g in got), prompts

    @pytest.mark.parametrize("prompts,where", [
        ({"x": 1}, "prompts"),  # a dict's keys were taken as prompts
        ({"prompt": "a", "prompt_token_ids": [1]}, "prompts"),
        ({"prompt": 5}, "prompts['prompt']"),
        ({"prompt_token_ids": "abc"}, "prompts['prompt_token_ids']"),
        ({"prompt_token_ids": [1, 2.5]}, "prompts['prompt_token_ids']"),
        (["a", {"x": 1}], "prompts[1]"),
        (["a", None], "prompts[1]"),
        ([[1, 2], [3, None]], "prompts[1]"),
        ({"hello", "world"}, "prompts"),  # a set: prompts in hash order
        (b"ab", "prompts"),  # bytes: token ids 97, 98
        ((p for p in ["a"]), "prompts"),
        (5, "prompts"),
        ([], "prompts"),
    ], ids=["other-keys", "both-keys", "prompt-int", "ids-str", "ids-float", "entry-dict", "entry-none",
            "entry-ids", "set", "bytes", "generator", "int", "empty"])
    def test_anything_else_is_refused_naming_the_argument(self, llm, prompts, where):
        with pytest.raises((TypeError, ValueError)) as e:
            llm.generate(prompts, max_tokens=2, temperature=0.0)
        assert str(e.value).startswith(where), str(e.value)
        assert not llm.engine.has_unfinished_requests()
