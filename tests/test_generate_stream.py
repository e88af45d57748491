"""Streaming `mla-export generate`, `--chat`, `LLM.chat()`, and the engine's incremental
detokenization and output kinds. All at f32 (exact comparisons)."""

from __future__ import annotations

import io

import pytest

from mla_export.cli import main
from mla_export.cli.text import terminal_safe


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def llm(model_dir):
    from mla_export import LLM

    return LLM(model_dir, precision="f32")


class _Log(io.StringIO):
    """stdout that records every write in one event log shared with the engine's steps."""

    def __init__(self, events):
        super().__init__()
        self.events = events

    def write(self, s):
        self.events.append(("write", s))
        return super().write(s)


def test_generate_prints_text_before_the_last_step(model_dir, llm, monkeypatch):
    # Partial output must reach stdout while the engine still has steps to run: every write and
    # every engine step go into one log, and a write must come before the final step.
    from mla_export.cli.commands import generate
    from mla_export.runtime.engine import LLMEngine

    events = []
    real_step = LLMEngine.step

    def step(self):
        events.append(("step", None))
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step)
    out = _Log(events)
    args = _args(model_dir, ["--prompt", "The quick brown fox", "--max-tokens", "24", "--ignore-eos",
                             "--precision", "f32"])
    assert generate.run(args, stdout=out) == 0
    steps = [i for i, (kind, _) in enumerate(events) if kind == "step"]
    writes = [i for i, (kind, s) in enumerate(events) if kind == "write" and s.strip()]
    assert len(steps) >= 24 and writes, events
    assert writes[0] < steps[-1], "no text was printed before the last engine step"
    assert len([i for i in writes if i < steps[-1]]) >= 5  # not one burst at the end
    expected = llm.generate("The quick brown fox", max_tokens=24, temperature=0.0, ignore_eos=True)[0]
    assert out.getvalue() == terminal_safe(expected.text) + "\n"  # the pieces add up to the whole text


def _args(model_dir, argv):
    import argparse

    from mla_export.cli.commands import generate

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    generate.add_parser(sub)
    return parser.parse_args(["generate", str(model_dir), *argv])


def test_generate_chat_equals_llm_chat_and_transformers_template(model_dir, llm, capsys):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, max_tokens=6, temperature=0.0)[0]
    hf_ids = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out.prompt_token_ids == list(hf_ids)
    assert main(["generate", str(model_dir), "--chat", "--system", "Be brief.", "-p", "What is the capital of France?",
                 "-n", "6", "--precision", "f32"]) == 0
    assert capsys.readouterr().out == terminal_safe(out.text) + "\n"  # control characters escaped for the terminal
    # A batch of conversations, and a template passed in.
    two = llm.chat([messages, messages[1:]], max_tokens=3, temperature=0.0)
    assert two[0].token_ids == out.token_ids[:3] and len(two) == 2
    custom = llm.chat(messages[1:], max_tokens=2, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert custom[0].prompt_token_ids == llm.tokenizer.encode("What is the capital of France?",
                                                              add_special_tokens=False).ids
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}])


def test_generate_chat_needs_a_prompt(model_dir, capsys):
    assert main(["generate", str(model_dir), "--prompt-ids", "1,2", "--chat"]) == 2
    assert "--chat takes the user message" in capsys.readouterr().err
    assert main(["generate", str(model_dir), "-p", "hi", "--system", "x"]) == 2
    assert "--system is used only with --chat" in capsys.readouterr().err


def test_detokenizer_deltas_add_up_to_the_full_decode(model_dir, rng):
    # Multi-byte characters split over byte-level tokens: the deltas hold back a partial
    # character and add up to tokenizer.decode(ids) at every finish point.
    from tokenizers import Tokenizer

    from mla_export.runtime.detokenizer import IncrementalDetokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "héllo wörld 日本語 🦊 fox, Ünïcödé ∑ the quick brown"
    ids = tok.encode(text, add_special_tokens=False).ids
    random_ids = rng.integers(0, tok.get_vocab_size(), size=64).tolist()  # invalid UTF-8 runs too
    for seq in (ids, random_ids):
        for end in range(1, len(seq) + 1):
            d = IncrementalDetokenizer(tok)
            pieces = [d.step(t) for t in seq[:end]]
            assert all("\ufffd" not in p for p in pieces) or seq is random_ids
            rest, final = d.finish(seq[:end])
            assert final == tok.decode(seq[:end], skip_special_tokens=True)
            if seq is ids:
                assert "".join(pieces) + rest == final
    d = IncrementalDetokenizer(tok)
    assert "".join(d.step(t) for t in ids) == text  # complete characters come out before the end


def test_output_kinds_agree(model_dir):
    from mla_export.runtime import LLMEngine, SamplingParams

    engine = LLMEngine(model_dir, precision="f32", max_num_seqs=4)
    seen = {}
    for kind in ("cumulative", "delta", "final_only"):
        engine.add_request(kind, "Once upon a time", SamplingParams(max_tokens=12, temperature=0.0,
                                                                    ignore_eos=True, output_kind=kind))
        seen[kind] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    cum, delta, final = seen["cumulative"], seen["delta"], seen["final_only"]
    assert len(cum) == len(delta) == 12 and len(final) == 1 and final[0].finished
    assert [t for o in delta for t in o.token_ids] == cum[-1].token_ids == final[0].token_ids
    assert "".join(o.text for o in delta) == cum[-1].text == final[0].text
    assert [o.new_text for o in delta] == [o.new_text for o in cum]
    for i, o in enumerate(cum):  # cumulative text is always the sum of the deltas so far
        assert o.text == "".join(d.text for d in delta[:i + 1])
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="partial")
