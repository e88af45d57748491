"""`mla-export export`: the tiny preset end to end, and the error paths (exit 2, one clear message,
OUT_DIR untouched and no partial directory left beside it)."""

from __future__ import annotations

import json
import shutil

import pytest

from mla_export.cli import main
from mla_export.formats.contract import load_contract
from mla_export.checkpoint.presets import make_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "m", "deepseek_v3", seed=3)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _no_leftovers(out):
    assert not out.exists() or not any(out.iterdir())
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name]


def test_preset_tiny_default_export(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["export", "--preset", "tiny", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    # One progress display over every phase, the IR conversion included (phase names are
    # always drawn; the bar's own updates are rate-limited).
    assert "writing the tiny preset checkpoint" in captured.err and "converting to OpenVINO IR" in captured.err
    assert "100%" in captured.err and "KV cache per token" in captured.out
    c = load_contract(out)
    assert c.files["openvino_xml"] == "openvino_model.xml" and c.files["onnx"] is None  # default: IR only
    assert not (out / "model.onnx").exists() and not (out / "model.onnx.data").exists()
    assert c.cache["dtype"] == "f16" and c.cache["graph_dtype"] == "u8" and c.cache["block_size"] == 16  # f16: the default
    assert c.tokenizer_path().is_file() and "Assistant" in c.chat_template
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(c.tokenizer_path()))
    ids = tok.encode("Hello world").ids
    assert ids[0] == c.model["bos_token_id"] and tok.decode(ids, skip_special_tokens=True) == "Hello world"
    from mla_export import ov_core

    c.validate_openvino_model(ov_core().read_model(str(c.graph_path("openvino_xml"))))


def test_unsupported_model_type(tmp_path, checkpoint, capsys):
    ckpt = _copy(checkpoint, tmp_path / "llama")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    out = tmp_path / "out"
    assert main(["export", str(ckpt), "-o", str(out)]) == 2
    assert "unsupported model_type 'llama'" in capsys.readouterr().err
    _no_leftovers(out)


def test_missing_files(tmp_path, checkpoint, capsys):
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "nowhere"), "-o", str(out)]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err
    ckpt = _copy(checkpoint, tmp_path / "noweights")
    (ckpt / "model.safetensors").unlink()
    assert main(["export", str(ckpt), "-o", str(out)]) == 2
    assert "no *.safetensors weights" in capsys.readouterr().err
    (ckpt / "config.json").unlink()
    assert main(["export", str(ckpt), "-o", str(out)]) == 2
    assert "config.json: not found" in capsys.readouterr().err
    _no_leftovers(out)


def _rewrite_tensor(ckpt, name, fn):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors[name] = fn(tensors[name])
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("case", ["shape", "missing", "nan"])
def test_bad_weights_in_the_last_layer(tmp_path, checkpoint, capsys, case):
    """The failure comes after earlier layers were written: still nothing is left behind."""
    ckpt = _copy(checkpoint, tmp_path / "bad")
    name = "model.layers.2.self_attn.kv_b_proj.weight"
    if case == "shape":
        _rewrite_tensor(ckpt, name, lambda t: t[:, :-1].contiguous())
        expected = "has shape"
    elif case == "missing":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(ckpt / "model.safetensors"))
        del tensors[name]
        save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
        expected = "is missing"
    else:
        _rewrite_tensor(ckpt, name, lambda t: t.clone().fill_(float("nan")))
        expected = "NaN"
    out = tmp_path / "out"
    assert main(["export", str(ckpt), "-o", str(out), "--format", "both", "--portable"]) == 2
    err = capsys.readouterr().err
    assert expected in err and name in err
    _no_leftovers(out)


def test_bad_config_values(tmp_path, checkpoint, capsys):
    ckpt = _copy(checkpoint, tmp_path / "cfg")
    cfg = json.loads((ckpt / "config.json").read_text())
    for change, message in [(dict(kv_lora_rank=0), "kv_lora_rank must be a positive integer"),
                            (dict(quantization_config={"quant_method": "fp8"}), "quantization_config.weight_block_size"),
                            (dict(quantization_config={"quant_method": "awq"}), "quantized checkpoints"),
                            (dict(hidden_act="gelu"), "hidden_act"),
                            (dict(topk_group=5), "topk_group (5) must be <= n_group")]:
        (ckpt / "config.json").write_text(json.dumps(dict(cfg, **change)))
        assert main(["export", str(ckpt), "-o", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    _no_leftovers(tmp_path / "out")


def test_output_directory_rules(tmp_path, checkpoint, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert main(["export", str(checkpoint), "-o", str(out), "--format", "onnx"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(checkpoint), "-o", str(out), "--format", "onnx", "--overwrite"]) == 2
    assert "not an mla-export output" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"
    (out / "precious.txt").unlink()
    assert main(["export", str(checkpoint), "-o", str(out), "--format", "onnx", "-q"]) == 0  # empty dir: fine
    assert main(["export", str(checkpoint), "-o", str(out), "--format", "onnx", "-q", "--overwrite",
                 "--kv-dtype", "f32", "--block-size", "8"]) == 0  # a previous export: replaced
    c = load_contract(out)
    assert (c.cache["dtype"], c.cache["block_size"]) == ("f32", 8) and c.files["openvino_xml"] is None
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_argument_errors(tmp_path, checkpoint, capsys):
    assert main(["export", "-o", str(tmp_path / "o")]) == 2
    assert "MODEL_DIR or --preset" in capsys.readouterr().err
    assert main(["export", str(checkpoint), "-o", str(tmp_path / "o"), "--block-size", "0"]) == 2
    assert "--block-size must be a positive integer" in capsys.readouterr().err


def test_weight_dtypes_store_and_match(tmp_path, checkpoint):
    """bf16/f16 weights are stored narrow (files ~half the size) and the IR keeps them so."""
    sizes = {}
    for wd in ("f32", "bf16", "f16"):
        out = tmp_path / wd
        assert main(["export", str(checkpoint), "-o", str(out), "-q", "--weight-dtype", wd, "--format", "both"]) == 0
        sizes[wd] = ((out / "model.onnx.data").stat().st_size, (out / "openvino_model.bin").stat().st_size)
        assert load_contract(out).raw["export"]["weight_dtype"] == wd
    for wd in ("bf16", "f16"):
        assert sizes[wd][0] < 0.6 * sizes["f32"][0] and sizes[wd][1] < 0.6 * sizes["f32"][1]


def test_ir_weights_file_is_the_onnx_data_file(tmp_path, checkpoint):
    """The IR's .bin is the ONNX graph's external data itself: one copy of the weights on disk."""
    import os

    both = tmp_path / "both"
    assert main(["export", str(checkpoint), "-o", str(both), "-q", "--format", "both", "--weight-format", "int4"]) == 0
    assert os.path.samefile(both / "openvino_model.bin", both / "model.onnx.data")
    ir = tmp_path / "ir"
    assert main(["export", str(checkpoint), "-o", str(ir), "-q", "--weight-format", "int4"]) == 0
    assert not (ir / "model.onnx.data").exists()
    # the small constants the frontend made are appended after the weights: the .bin is barely larger
    assert (ir / "openvino_model.bin").stat().st_size < 1.05 * (both / "model.onnx.data").stat().st_size


def test_not_enough_disk_is_refused_before_writing(tmp_path, checkpoint, monkeypatch, capsys):
    import collections

    from mla_export.export import exporter

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(exporter.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    out = tmp_path / "o"
    assert main(["export", str(checkpoint), "-o", str(out), "--weight-format", "int8"]) == 2
    err = capsys.readouterr().err
    assert "the export needs about" in err and "GiB is free" in err
    _no_leftovers(out)
