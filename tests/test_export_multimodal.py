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

from mla_export.config import ConfigError, MLAModelConfig
from mla_export.export import export_model
from mla_export.presets import make_checkpoint


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


def test_the_top_level_decides_tied_embeddings(checkpoint):
    raw = json.loads((checkpoint / "config.json").read_text())
    assert MLAModelConfig.from_dict(raw).tie_word_embeddings is False
    raw.pop("tie_word_embeddings")  # transformers' default for the wrapper: tied
    raw["text_config"]["tie_word_embeddings"] = False
    assert MLAModelConfig.from_dict(raw).tie_word_embeddings is True
