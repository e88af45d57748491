"""`chat_template_kwargs` against the server (issue 36, cause 3): its keys are template variables
(a key "self" collided with the render method's own argument: a TypeError and an HTTP 500), the
names the renderer sets itself are refused with a 400 naming them, add_generation_prompt is
merged with the top-level field (as vLLM merges it; a contradiction is refused), and every
render failure is a 400 naming the field to blame. On /v1/chat/completions and /tokenize (both
render the same way), over a real served tiny export."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import ServerThread

# The tiny export's conversation format, plus variables a template may read from chat_template_kwargs.
TEMPLATE = ("{{ bos_token + '' }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if scale is defined %}{{ 100 // scale }}{% endif %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(exports):
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(exports.tiny(), precision="f32", max_num_seqs=2, max_num_batched_tokens=64)
    with ServerThread(engine, model_name="tiny", max_num_seqs=2, max_queue=8, chat_template=TEMPLATE) as srv:
        yield srv


def _chat(server, **body) -> httpx.Response:
    return httpx.post(server.base + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **body},
                      timeout=120)


def _tokenize(server, **body) -> httpx.Response:
    return httpx.post(server.base + "/tokenize", json={"messages": MESSAGES, "return_token_strs": True, **body},
                      timeout=60)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return "".join(r.json()["token_strs"])


class TestChatTemplateKwargs:
    @pytest.mark.parametrize("send", [_chat, _tokenize], ids=["chat", "tokenize"])
    def test_any_name_is_a_variable_not_a_python_argument(self, server, send):
        for kwargs in ({"self": 1}, {"template_kwargs": 2}, {"": 3}, {"kwargs": {"a": 1}}):
            r = send(server, chat_template_kwargs=kwargs)
            assert r.status_code == 200, (kwargs, r.text)  # "self" was a TypeError, a 500

    @pytest.mark.parametrize("send", [_chat, _tokenize], ids=["chat", "tokenize"])
    @pytest.mark.parametrize("key", ["messages", "tools", "raise_exception", "strftime_now", "chat_template",
                                     "tokenize"])
    def test_reserved_names_are_400_naming_them(self, server, send, key):
        r = send(server, chat_template_kwargs={key: []})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == f"chat_template_kwargs.{key}", r.text

    def test_add_generation_prompt_is_merged(self, server):
        on = _text(_tokenize(server))
        off = _text(_tokenize(server, chat_template_kwargs={"add_generation_prompt": False}))
        assert on.endswith("<assistant>") and not off.endswith("<assistant>"), (on, off)
        assert _text(_tokenize(server, add_generation_prompt=False,
                               chat_template_kwargs={"add_generation_prompt": False})) == off
        for send in (_chat, _tokenize):
            r = send(server, add_generation_prompt=True, chat_template_kwargs={"add_generation_prompt": False})
            assert r.status_code == 400, r.text  # two answers to one question: neither is silently dropped
            assert r.json()["error"]["param"] == "chat_template_kwargs.add_generation_prompt"
            r = send(server, chat_template_kwargs={"add_generation_prompt": "no"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs.add_generation_prompt"
        r = _chat(server, chat_template_kwargs={"add_generation_prompt": False})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(
            _tokenize(server, chat_template_kwargs={"add_generation_prompt": False}).json()["tokens"])

    def test_special_tokens_can_be_set_as_transformers_allows(self, server):
        assert _text(_tokenize(server, chat_template_kwargs={"bos_token": "<<B>>"})).startswith("<<B>>")

    @pytest.mark.parametrize("send", [_chat, _tokenize], ids=["chat", "tokenize"])
    @pytest.mark.parametrize("kwargs", [{"scale": 0}, {"scale": "x"}, {"bos_token": 5}],
                             ids=["zero-division", "str-floordiv", "int-plus-str"])
    def test_a_render_failure_caused_by_the_kwargs_is_400_naming_them(self, server, send, kwargs):
        r = send(server, chat_template_kwargs=kwargs)
        assert r.status_code == 400, r.text  # a ZeroDivisionError was a 500
        assert r.json()["error"]["param"] == "chat_template_kwargs", r.text

    def test_the_blame_goes_where_the_render_fails(self):
        from mla_export.runtime.chat_template import ChatTemplate, TemplateError

        always = ChatTemplate("{{ raise_exception('no user turn') }}")
        with pytest.raises(TemplateError) as e:
            always.render(MESSAGES, template_kwargs={"x": 1})
        assert e.value.param == "messages"  # it fails without the kwargs too
        only_kwargs = ChatTemplate("{{ messages | length }}{% if x is defined %}{{ x.y.z() }}{% endif %}")
        assert only_kwargs.render(MESSAGES) == "1"
        with pytest.raises(TemplateError) as e:
            only_kwargs.render(MESSAGES, template_kwargs={"x": 1})
        assert e.value.param == "chat_template_kwargs"
