"""Loaded exports hold together: nothing mla_graph.json names may resolve outside the export
directory, a changed or truncated file is refused (sizes and digests recorded at export), and a
contract whose vocab or positions disagree with the graph is refused. Tiny f32 export."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from mla_export.formats.contract_error import ContractError
from mla_export.formats.contract import load_contract
from mla_export.runtime import LLMEngine
from mla_export.runtime.chat_template import load_chat_template


@pytest.fixture(scope="module")
def out_dir(exports):
    return exports.model("deepseek_v3", "f32", 4)[1]


@pytest.fixture
def copy(out_dir, tmp_path):
    dst = tmp_path / "export"
    shutil.copytree(out_dir, dst)
    return dst


def _edit(d, fn):
    raw = json.loads((d / "mla_graph.json").read_text())
    fn(raw)
    (d / "mla_graph.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("key", ["openvino_bin", "openvino_xml"])
@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_file_names_outside_the_export_are_refused(copy, key, how):
    outside = copy.parent / f"elsewhere-{key}"
    shutil.copy(copy / f"openvino_model.{key[9:]}", outside)
    name = f"../{outside.name}" if how == "dotdot" else str(outside)
    _edit(copy, lambda raw: raw["files"].__setitem__(key, name))
    with pytest.raises(ContractError, match="inside the export directory"):
        load_contract(copy)


def test_a_symlink_out_of_the_export_is_refused(copy):
    real = copy.parent / "tokenizer-elsewhere.json"
    shutil.move(copy / "tokenizer.json", real)
    os.symlink(real, copy / "tokenizer.json")
    with pytest.raises(ContractError, match="outside the export directory"):
        load_contract(copy)


def test_tokenizer_and_chat_template_names_are_confined(copy):
    shutil.copy(copy / "tokenizer.json", copy.parent / "tok.json")
    _edit(copy, lambda raw: raw["tokenizer"].__setitem__("file", "../tok.json"))
    with pytest.raises(ContractError, match="tokenizer.file"):
        load_contract(copy)
    (copy.parent / "t.jinja").write_text("{{ messages }}")
    with pytest.raises(ContractError, match="chat_template"):
        load_chat_template(copy, "../t.jinja")


def test_a_changed_weights_file_is_refused(copy):
    path = copy / "openvino_model.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ContractError, match="differs from the file the export wrote"):
        load_contract(copy)


def test_a_truncated_weights_file_is_refused(copy):
    path = copy / "openvino_model.bin"
    path.write_bytes(path.read_bytes()[:-4096])
    with pytest.raises(ContractError, match="changed or truncated"):
        load_contract(copy)


@pytest.mark.parametrize("key,value", [("vocab_size", 1000), ("max_position_embeddings", 4096)])
def test_a_contract_that_disagrees_with_the_graph_is_refused(copy, key, value):
    _edit(copy, lambda raw: raw["model"].__setitem__(key, value))
    with pytest.raises(ContractError, match="different models|another model"):
        LLMEngine(copy, precision="f32", num_blocks=8)
