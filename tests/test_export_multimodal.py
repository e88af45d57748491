"""Multimodal checkpoints whose text tower is exported (mla_export/families/wrappers.py): Mistral
Small 4 as released (`mistral3`: a `mistral4` text tower beside a Pixtral vision tower). Its
logits against transformers are checked with the other families (tests/test_export_families.py);
here: both weight layouts give the same export, the vision tower is left out, and a config whose
text tower is not one of ours is refused naming it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mla_export.checkpoint.config import ConfigError, MLAModelConfig
from mla_export.export import export_model
from mla_export.checkpoint.presets import make_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("m3") / "ckpt", "mistral3", seed=4)


def _relayout(src, dst, old: str, new: str):
    """The same checkpoint with its text tower's tensors under another prefix."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()},
              str(dst / "model.safetensors"))


def test_both_weight_layouts_export_the_same_graph(checkpoint, tmp_path):
    from safetensors.numpy import load_file

    names = load_file(str(checkpoint / "model.safetensors")).keys()
    assert any(n.startswith("language_model.model.layers.") for n in names)  # as transformers saves it
    assert any(n.startswith("vision_tower.") for n in names)
    other = tmp_path / "other"
    _relayout(checkpoint, other, "language_model.model.", "model.language_model.")
    outs = []
    for i, ckpt in enumerate((checkpoint, other)):
        out = tmp_path / f"out{i}"
        export_model(ckpt, out, fmt="openvino", block_size=4, kv_dtype="f32", weight_dtype="f32")
        outs.append(out)
    a, b = ((o / "openvino_model.bin").read_bytes() for o in outs)
    assert a == b
    facts = json.loads((outs[0] / "mla_graph.json").read_text())["model"]
    assert (facts["model_type"], facts["family"]) == ("mistral3", "mistral4")
    # only the text tower's weights: the vision tower's are not in the graph
    text_params = sum(np.prod(v.shape) for k, v in load_file(str(checkpoint / "model.safetensors")).items()
                      if k.startswith("language_model."))
    assert json.loads((outs[0] / "mla_graph.json").read_text())["export"]["weight_params"]["f32"] <= text_params


@pytest.mark.parametrize("change, message", [
    (dict(text_config=None), "needs its text tower's text_config"),
    (dict(text_config=dict(model_type="mistral", vocab_size=10)), "text_config.model_type 'mistral' is not an MLA"),
])
def test_a_text_tower_that_is_not_ours_is_refused(checkpoint, change, message):
    raw = json.loads((checkpoint / "config.json").read_text())
    raw.update(change)
    with pytest.raises(ConfigError, match=message):
        MLAModelConfig.from_dict(raw)


@pytest.mark.parametrize("quant, message", [
    # Mistral's FP8 releases (transformers' conversion script writes this): per-tensor scales
    (dict(quant_method="fp8", activation_scheme="static", weight_block_size=None,
          modules_to_not_convert=["model.vision_tower", "model.multi_modal_projector", "lm_head"]),
     "activation_scheme 'static' is not supported"),
    (dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=None), "weight_block_size must be"),
])
def test_fp8_without_block_scales_at_the_top_level_is_refused_naming_the_key(checkpoint, quant, message):
    raw = json.loads((checkpoint / "config.json").read_text())
    raw["quantization_config"] = quant  # a quantized release says it at the top level, beside text_config
    with pytest.raises(ConfigError, match=message):
        MLAModelConfig.from_dict(raw)


def test_the_top_level_decides_tied_embeddings(checkpoint):
    raw = json.loads((checkpoint / "config.json").read_text())
    assert MLAModelConfig.from_dict(raw).tie_word_embeddings is False
    raw.pop("tie_word_embeddings")  # transformers' default for the wrapper: tied
    raw["text_config"]["tie_word_embeddings"] = False
    assert MLAModelConfig.from_dict(raw).tie_word_embeddings is True


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    """The mistral3 checkpoint exported once (OpenVINO IR, f32): its ExportResult."""
    return export_model(checkpoint, tmp_path_factory.mktemp("m3out") / "out", fmt="openvino", block_size=4,
                        kv_dtype="f32", weight_dtype="f32")


class TestTheSummarySaysTheVisionTowerIsLeftOut:
    """A multimodal checkpoint exports its text tower only: the export summary says so in one
    line, counting what it left out as the checkpoint holds it."""

    def test_the_left_out_modules_are_counted_from_the_checkpoint(self, checkpoint, exported):
        from safetensors.numpy import load_file

        want = {}
        for name, v in load_file(str(checkpoint / "model.safetensors")).items():
            if not name.startswith("language_model."):
                g = want.setdefault(name.split(".")[0], {"tensors": 0, "params": 0})
                g["tensors"] += 1
                g["params"] += int(np.prod(v.shape))
        assert set(want) == {"vision_tower", "multi_modal_projector"}
        assert exported.contract["export"]["left_out"] == want
        recorded = json.loads((exported.out_dir / "mla_graph.json").read_text())["export"]["left_out"]
        assert recorded == want

    def test_one_summary_line_names_them_and_says_text_only(self, exported):
        from mla_export.export.summary import summary_lines

        lines = [ln for ln in summary_lines(exported) if ln.startswith("text tower only")]
        g = exported.contract["export"]["left_out"]
        assert lines == [f"text tower only: left out multi_modal_projector ({g['multi_modal_projector']['tensors']} "
                         f"tensors, {g['multi_modal_projector']['params']} params), vision_tower "
                         f"({g['vision_tower']['tensors']} tensors, {g['vision_tower']['params']} params); "
                         "image inputs are not supported"]

    def test_a_text_only_checkpoint_says_nothing_of_the_kind(self, exports):
        from mla_export.formats.contract import load_contract

        contract = load_contract(exports.tiny())
        assert contract.raw["export"]["left_out"] is None


def _chat(parts):
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def engine(exported):
    from mla_export.runtime import LLMEngine

    return LLMEngine(exported.out_dir, precision="f32", max_num_seqs=2, max_num_batched_tokens=64)


_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


class TestImageContentIsRefused:
    """The exported model reads text only: a chat message holding an image part is refused with
    400 naming the part (never answered as though the image were not there); text parts work."""

    def test_the_server_refuses_an_image_url_part(self, engine):
        import httpx

        from server_helpers import ServerThread

        with ServerThread(engine, model_name="m3", max_num_seqs=2, max_queue=4) as srv:
            r = httpx.post(srv.base + "/v1/chat/completions", timeout=120,
                           json=_chat([{"type": "text", "text": "what is this?"}, _IMAGE]))
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "messages.[0].content.[1]"
            assert "'image_url' content is not supported" in err["message"]
            assert "vision tower is not exported" in err["message"]
            ok = httpx.post(srv.base + "/v1/chat/completions", timeout=120,
                            json=_chat([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
            assert ok.status_code == 200, ok.text

    def test_llm_chat_refuses_an_image_part(self, engine):
        from mla_export.runtime.llm import LLM

        llm = LLM(engine=engine)
        with pytest.raises(ValueError, match=r"messages\[0\]\['content'\]\[1\]: 'image_url' content is not supported"):
            llm.chat([{"role": "user", "content": [{"type": "text", "text": "x"}, _IMAGE]}], max_tokens=2)
        text_parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                              max_tokens=2, temperature=0)
        as_string = llm.chat([{"role": "user", "content": "ab"}], max_tokens=2, temperature=0)
        assert text_parts[0].prompt_token_ids == as_string[0].prompt_token_ids
